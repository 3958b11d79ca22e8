"""Loss helpers of the reference Trainer: label smoothing, the window's label count, loss extraction.

Rules R4.1 - R4.3 and R4.9. transformers is consulted lazily, and only for models that
come from it, to decide whether a model's loss shifts its labels (causal LM).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch
from torch import nn

from hf_lightning.data.model_inputs import unwrap_peft_model


class LabelSmoothingLabelsError(ValueError, RuntimeError):
    """Labels the label smoother cannot index with (a ``RuntimeError`` from ``gather`` in the reference)."""


class LabelSmoother:
    """Label-smoothed cross entropy on a model's logits, normalised like the reference (R4.2)."""

    def __init__(self, epsilon: float = 0.1, ignore_index: int = -100):
        self.epsilon = epsilon
        self.ignore_index = ignore_index

    def __call__(self, model_output, labels, shift_labels: bool = False, num_items_in_batch=None):
        logits = model_output["logits"] if isinstance(model_output, dict) else model_output[0]
        if labels.is_floating_point() or labels.is_complex():
            raise LabelSmoothingLabelsError(
                f"label_smoothing_factor={self.epsilon}: label smoothing needs integer class labels, but the "
                f"batch's labels are {labels.dtype} (a regression target?). Set `label_smoothing_factor=0`, or "
                "give class indices as labels."
            )
        if shift_labels:
            logits = logits[..., :-1, :].contiguous()
            labels = labels[..., 1:].contiguous()
        log_probs = -nn.functional.log_softmax(logits, dim=-1)
        if labels.dim() == log_probs.dim() - 1:
            labels = labels.unsqueeze(-1)
        padding_mask = labels.eq(self.ignore_index)
        labels = torch.clamp(labels, min=0)
        nll_loss = log_probs.gather(dim=-1, index=labels)
        smoothed_loss = log_probs.sum(dim=-1, keepdim=True, dtype=torch.float32)
        nll_loss.masked_fill_(padding_mask, 0.0)
        smoothed_loss.masked_fill_(padding_mask, 0.0)
        if num_items_in_batch is None:
            denominator = padding_mask.numel() - padding_mask.long().sum()
        elif torch.is_tensor(num_items_in_batch):
            denominator = num_items_in_batch.to(nll_loss.device)
        else:
            denominator = num_items_in_batch
        nll_loss = nll_loss.sum() / denominator
        smoothed_loss = smoothed_loss.sum() / (denominator * log_probs.shape[-1])
        return (1 - self.epsilon) * nll_loss + self.epsilon * smoothed_loss


def _transformers_module():
    """transformers if the user's program already imported it (a transformers model implies it)."""
    return sys.modules.get("transformers")


def _is_transformers_model(model: nn.Module) -> bool:
    return type(model).__module__.startswith("transformers.") and _transformers_module() is not None


def is_causal_lm_class(model: nn.Module) -> bool:
    """Whether the reference shifts labels for the label smoother: the class is a causal-LM head (R4.2)."""
    model = unwrap_peft_model(model)
    if not _is_transformers_model(model):
        return False
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return model._get_name() in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()


def loss_shifts_labels(model: nn.Module) -> bool:
    """Whether the window count uses `labels[..., 1:]`: the model's loss is the causal-LM loss (R4.3)."""
    model = unwrap_peft_model(model)
    if not _is_transformers_model(model):
        return False
    from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss

    is_encoder_decoder = getattr(getattr(model, "config", None), "is_encoder_decoder", False)
    return LOSS_MAPPING.get(getattr(model, "loss_type", None)) is ForCausalLMLoss and not is_encoder_decoder


def count_items_in_window(batches: Sequence[Mapping[str, Any]], shifts_labels: bool) -> torch.Tensor | None:
    """Label entries != -100 over every micro-batch of a window (R4.3); None when labels are not tensors."""
    try:
        labels = [
            batch["shift_labels"]
            if "shift_labels" in batch
            else batch["labels"][..., 1:]
            if shifts_labels
            else batch["labels"]
            for batch in batches
        ]
        return sum(label.ne(-100).sum() for label in labels)
    except (TypeError, AttributeError):
        return None


def extract_loss(outputs: Any, inputs: Mapping[str, Any]) -> torch.Tensor:
    """The loss a model returned: `outputs["loss"]` for mappings, else the first element (R4.1)."""
    if isinstance(outputs, dict) and "loss" not in outputs:
        raise ValueError(
            "The model did not return a loss from the inputs, only the following keys: "
            f"{','.join(outputs.keys())}. For reference, the inputs it received are {','.join(inputs.keys())}."
        )
    return outputs["loss"] if isinstance(outputs, dict) else outputs[0]


def neftune_post_forward_hook(module: nn.Module, inputs, output: torch.Tensor) -> torch.Tensor:
    """Add uniform noise of magnitude alpha / sqrt(L * d) to embeddings in training mode (R4.9)."""
    if module.training:
        dims = torch.tensor(output.size(1) * output.size(2))
        mag_norm = module.neftune_noise_alpha / torch.sqrt(dims)
        output = output + torch.zeros_like(output).uniform_(-mag_norm, mag_norm)
    return output


def activate_neftune(model: nn.Module, neftune_noise_alpha: float):
    """Attach the NEFTune hook to the model's input embeddings; returns the hook handle."""
    embeddings = unwrap_peft_model(model).get_input_embeddings()
    embeddings.neftune_noise_alpha = neftune_noise_alpha
    return embeddings.register_forward_hook(neftune_post_forward_hook)


def deactivate_neftune(model: nn.Module, hook_handle) -> None:
    """Remove the NEFTune hook installed by `activate_neftune`."""
    embeddings = unwrap_peft_model(model).get_input_embeddings()
    hook_handle.remove()
    if hasattr(embeddings, "neftune_noise_alpha"):
        del embeddings.neftune_noise_alpha


class ItemCountSource(Protocol):
    """The trainer as the item-count probe sees it: whether its loss is normalised by `num_items_in_batch` (the
    subclass's flag, the model's `**kwargs`, a custom loss function)."""

    loss_is_scaled_for_ga: bool | None
    model_accepts_loss_kwargs: bool
    compute_loss_func: Any


class UnusedItemCountProbe:
    """Warns once when a model counted as normalising by `num_items_in_batch` does not use it.

    The reference treats any model whose forward takes `**kwargs` as already normalising its loss by
    the window's label count, so it does not divide by the accumulation steps (a documented quirk we
    reproduce). Heads that ignore the count (e.g. sequence classification) then train with GA-times
    larger gradients. The probe costs no extra forward: the count of the first window is made a leaf
    that requires grad, and after that micro-batch's backward an empty `.grad` means the loss never
    used it.
    """

    def __init__(self) -> None:
        self._finished = False
        self._count: torch.Tensor | None = None

    def arm(self, trainer: ItemCountSource, num_items_in_batch: Any, window_size: int) -> Any:
        """Return the count to pass to the first micro-batch (a grad-requiring copy when probing)."""
        if self._finished:
            return num_items_in_batch
        self._finished = True
        probing = (
            window_size > 1
            and trainer.loss_is_scaled_for_ga is None
            and trainer.model_accepts_loss_kwargs
            and trainer.compute_loss_func is None
            and torch.is_tensor(num_items_in_batch)
            and num_items_in_batch.is_floating_point()
        )
        if not probing:
            return num_items_in_batch
        self._count = num_items_in_batch.detach().clone().requires_grad_(True)
        return self._count

    def check(self, model: nn.Module) -> None:
        """After the first micro-batch's backward: warn if its loss did not depend on the count."""
        if self._count is None:
            return
        unused = self._count.grad is None
        self._count = None
        if unused:
            warnings.warn(
                f"{type(model).__name__}.forward accepts **kwargs, so (as in transformers.Trainer) its loss is "
                "treated as already normalised by `num_items_in_batch` and is not divided by "
                "gradient_accumulation_steps; but the loss does not use `num_items_in_batch`, so gradients "
                "and logged losses are gradient_accumulation_steps times a per-batch mean. To divide by the "
                "accumulation steps instead, set `loss_is_scaled_for_ga = False` on a Trainer subclass or "
                "`model.accepts_loss_kwargs = False`.",
                UserWarning,
                stacklevel=2,
            )
