"""`HFLightningSeq2SeqTrainer`: transformers' `Seq2SeqTrainer` on the hf_lightning facade (S2S-6.1 to S2S-6.3).

It adds generation to evaluation: with `predict_with_generate=True`, `evaluate()` / `predict()` return the
tokens of `model.generate()` instead of logits, padded as the reference pads them, and still report the loss.
transformers is imported only to load a `GenerationConfig` (`args.generation_config`).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from hf_lightning.args.training_args import Seq2SeqTrainingArguments, as_training_arguments
from hf_lightning.callbacks import TrainerCallback
from hf_lightning.core.outputs import PredictionOutput
from hf_lightning.trainer.trainer import HFLightningTrainer, _public_signature

__all__ = ["HFLightningSeq2SeqTrainer", "Seq2SeqTrainer", "resolve_gen_kwargs"]

_INSTALL_TRANSFORMERS = '`pip install -e ".[transformers]"` from a checkout (or `pip install transformers`)'


def resolve_gen_kwargs(gen_kwargs: Mapping[str, Any], args: Any) -> dict[str, Any]:
    """The `generate()` keywords of one `evaluate()` / `predict()` call, in the reference's order.

    Explicit keywords win; `args.generation_max_length` fills `max_length` only when neither `max_length` nor
    `max_new_tokens` was given, and `args.generation_num_beams` fills `num_beams` when it was not given. The rest
    falls back, inside `generate()`, to `model.generation_config` and then the library defaults.
    """
    resolved = dict(gen_kwargs)
    if (
        resolved.get("max_length") is None
        and resolved.get("max_new_tokens") is None
        and args.generation_max_length is not None
    ):
        resolved["max_length"] = args.generation_max_length
    if resolved.get("num_beams") is None and args.generation_num_beams is not None:
        resolved["num_beams"] = args.generation_num_beams
    return resolved


def _generation_config_class(gen_config_arg: Any) -> type | None:
    """transformers' `GenerationConfig`, imported on demand; None when transformers is not installed."""
    try:
        from transformers import GenerationConfig
    except ImportError:
        if isinstance(gen_config_arg, (str, os.PathLike)):
            raise ImportError(
                f"generation_config={str(gen_config_arg)!r}: loading a GenerationConfig needs transformers, which "
                f"is not installed. Install it with {_INSTALL_TRANSFORMERS}, or leave generation_config=None and "
                "set model.generation_config yourself."
            ) from None
        return None
    return GenerationConfig


class HFLightningSeq2SeqTrainer(HFLightningTrainer):
    """Drop-in for `transformers.Seq2SeqTrainer`: the facade plus `generate()` during evaluation and prediction."""

    def __init__(
        self,
        model: nn.Module | None = None,
        args: Seq2SeqTrainingArguments | None = None,
        data_collator: Callable | None = None,
        train_dataset: Dataset | None = None,
        eval_dataset: Dataset | dict[str, Dataset] | None = None,
        processing_class: Any = None,
        model_init: Callable[..., nn.Module] | None = None,
        compute_loss_func: Callable | None = None,
        compute_metrics: Callable | Mapping[str, Any] | None = None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers: tuple[torch.optim.Optimizer | None, Any] = (None, None),
        preprocess_logits_for_metrics: Callable | None = None,
        **deprecated_kwargs: Any,
    ):
        # Only the v4 `tokenizer=` alias and our `telemetry=` are accepted (the facade handles them); the
        # reference's Seq2SeqTrainer has no `optimizer_cls_and_kwargs`.
        unexpected = [name for name in deprecated_kwargs if name not in ("tokenizer", "telemetry")]
        if unexpected:
            raise TypeError(
                f"HFLightningSeq2SeqTrainer.__init__() got an unexpected keyword argument '{unexpected[0]}'"
            )
        args = (
            Seq2SeqTrainingArguments(output_dir="tmp_trainer")
            if args is None
            else as_training_arguments(args)
        )
        if not isinstance(args, Seq2SeqTrainingArguments):
            raise ValueError(
                f"args: HFLightningSeq2SeqTrainer needs Seq2SeqTrainingArguments, got {type(args).__name__} (the "
                "reference fails on it too). Build them with hf_lightning.Seq2SeqTrainingArguments(...)."
            )
        super().__init__(
            model=model,
            args=args,
            data_collator=data_collator,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            model_init=model_init,
            compute_loss_func=compute_loss_func,
            compute_metrics=compute_metrics,
            callbacks=callbacks,
            optimizers=optimizers,
            preprocess_logits_for_metrics=preprocess_logits_for_metrics,
            **deprecated_kwargs,
        )
        # Priority: args.generation_config > model.generation_config > library defaults.
        if self.args.generation_config is not None:
            self.model.generation_config = self.load_generation_config(self.args.generation_config)

    @staticmethod
    def load_generation_config(gen_config_arg: Any) -> Any:
        """A `GenerationConfig` from `args.generation_config`: a copy of an object, or loaded from a path / model id.

        A file is loaded from its folder under its own name, a folder from its `generation_config.json`, anything
        else as a Hub model id or URL. The result is validated strictly, as the reference does.
        """
        generation_config_class = _generation_config_class(gen_config_arg)
        if generation_config_class is not None and isinstance(gen_config_arg, generation_config_class):
            gen_config = copy.deepcopy(gen_config_arg)
        elif generation_config_class is not None and isinstance(gen_config_arg, (str, os.PathLike)):
            pretrained_model_name: Any = Path(gen_config_arg)
            config_file_name = None
            if pretrained_model_name.is_file():
                config_file_name = pretrained_model_name.name
                pretrained_model_name = pretrained_model_name.parent
            elif not pretrained_model_name.is_dir():
                # A model id or a URL, kept as given.
                pretrained_model_name = gen_config_arg
            gen_config = generation_config_class.from_pretrained(pretrained_model_name, config_file_name)
        else:
            raise ValueError(
                f"generation_config={gen_config_arg!r} ({type(gen_config_arg).__name__}) is not supported: pass a "
                "transformers GenerationConfig, the path of a generation config file or folder, or a model id."
            )
        # Fail early: `GenerationConfig.save_pretrained()` at the end of training raises on any validation warning.
        try:
            gen_config.validate(strict=True)
        except ValueError as exc:
            raise ValueError(str(exc) + "\n\nFix these issues to train your model.") from exc
        return gen_config

    def evaluate(
        self,
        eval_dataset: Dataset | dict[str, Dataset] | str | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
        **gen_kwargs: Any,
    ) -> dict[str, float]:
        """`Trainer.evaluate` with `generate()` keywords (`max_length`, `num_beams`, ...) for `predict_with_generate`."""
        self._gen_kwargs = resolve_gen_kwargs(gen_kwargs, self.args)
        # The reference gathers without dropping the last batch's padding samples here (EVAL-2.10).
        self._gather_drops_padding = False
        return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def predict(
        self,
        test_dataset: Dataset,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "test",
        **gen_kwargs: Any,
    ) -> PredictionOutput:
        """`Trainer.predict` with `generate()` keywords; generated tokens are padded with the pad token id."""
        self._gen_kwargs = resolve_gen_kwargs(gen_kwargs, self.args)
        self._gather_drops_padding = False
        return super().predict(test_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, torch.Tensor | Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
        **gen_kwargs: Any,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """`(loss, generated_tokens, labels)` with `predict_with_generate`, else the base `prediction_step`.

        Generated tokens and labels are right-padded with the pad token id to `model.generation_config.max_length`
        (or `max_new_tokens + 1`); the loss comes from a second, plain forward.
        """
        if not self.args.predict_with_generate or prediction_loss_only:
            return super().prediction_step(
                model, inputs, prediction_loss_only=prediction_loss_only, ignore_keys=ignore_keys
            )
        generate = getattr(self.model, "generate", None)
        if not callable(generate):
            raise ValueError(
                f"predict_with_generate=True needs a model with a `generate()` method; {type(self.model).__name__} "
                "has none. Set predict_with_generate=False, or use a model that generates (for example a "
                "transformers model with GenerationMixin)."
            )

        has_labels = "labels" in inputs
        inputs = self._prepare_inputs(inputs)

        # Priority (handled in generate): non-None gen_kwargs > model.generation_config > default GenerationConfig.
        if len(gen_kwargs) == 0 and hasattr(self, "_gen_kwargs"):
            gen_kwargs = self._gen_kwargs.copy()
        if "num_beams" in gen_kwargs and gen_kwargs["num_beams"] is None:
            gen_kwargs.pop("num_beams")
        if "max_length" in gen_kwargs and gen_kwargs["max_length"] is None:
            gen_kwargs.pop("max_length")
        gen_kwargs["synced_gpus"] = gen_kwargs.get("synced_gpus", self._generation_syncs_gpus())

        generation_inputs = inputs.copy()
        # `decoder_input_ids` made from the labels would make generate continue the padded labels: drop them.
        if (
            "labels" in generation_inputs
            and "decoder_input_ids" in generation_inputs
            and generation_inputs["labels"].shape == generation_inputs["decoder_input_ids"].shape
        ):
            generation_inputs = {
                k: v for k, v in inputs.items() if k not in ("decoder_input_ids", "decoder_attention_mask")
            }
        generated_tokens = generate(**generation_inputs, **gen_kwargs)

        max_length, max_new_tokens = self._generation_lengths()
        # A batch that stopped early is padded, so that batches concatenate on the generation config's width.
        if generated_tokens.shape[-1] < max_length:
            generated_tokens = self._pad_tensors_to_max_len(generated_tokens, max_length)
        elif max_new_tokens is not None and generated_tokens.shape[-1] < max_new_tokens + 1:
            generated_tokens = self._pad_tensors_to_max_len(generated_tokens, max_new_tokens + 1)

        with torch.no_grad():
            if has_labels:
                with self.compute_loss_context_manager():
                    outputs = model(**inputs)
                if self.label_smoother is not None:
                    loss = self.label_smoother(outputs, inputs["labels"]).detach().mean()
                else:
                    loss = (outputs["loss"] if isinstance(outputs, dict) else outputs[0]).detach().mean()
            else:
                loss = None

        if self.plan.evaluation.prediction_loss_only:
            return loss, None, None

        if has_labels:
            labels = inputs["labels"]
            if labels.shape[-1] < max_length:
                labels = self._pad_tensors_to_max_len(labels, max_length)
            elif max_new_tokens is not None and labels.shape[-1] < max_new_tokens + 1:
                labels = self._pad_tensors_to_max_len(labels, max_new_tokens + 1)
        else:
            labels = None
        return loss, generated_tokens, labels

    def _generation_lengths(self) -> tuple[int, int | None]:
        """`(max_length, max_new_tokens)` of `model.generation_config`, with the library defaults filled in.

        As in the reference, the model's config is updated in place: unset fields get their defaults (e.g.
        `max_length` 20) and a config derived from the model config stops being re-derived on every batch.
        """
        gen_config = getattr(self.model, "generation_config", None)
        if gen_config is None:
            raise ValueError(
                f"predict_with_generate=True: {type(self.model).__name__} has no `generation_config`, which gives the "
                "width generated tokens are padded to. Give the model a transformers GenerationConfig (or set "
                "Seq2SeqTrainingArguments.generation_config)."
            )
        if getattr(gen_config, "_from_model_config", False):
            gen_config._from_model_config = False
        default_params = getattr(gen_config, "_get_default_generation_params", None)
        if callable(default_params):
            gen_config.update(**default_params(), defaults_only=True)
        max_length = getattr(gen_config, "max_length", None)
        if not isinstance(max_length, int):
            raise ValueError(
                f"predict_with_generate=True: model.generation_config.max_length={max_length!r}; generated tokens "
                "are padded to this width, so it must be an int. Use a transformers GenerationConfig (it defaults "
                "to 20) or set max_length on the model's generation config."
            )
        return max_length, getattr(gen_config, "max_new_tokens", None)

    def _generation_syncs_gpus(self) -> bool:
        """`synced_gpus` for `generate()`: every rank must run each step when the weights are sharded.

        The reference turns it on for DeepSpeed ZeRO-3 and FSDP-managed models. Only with a process group: a
        ZeRO-3 evaluation before `train()` runs the plain model in one process, where syncing has no peers.
        """
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return False
        return self._strategy_steps.generation_syncs_processes(self.model)

    def _pad_tensors_to_max_len(self, tensor: torch.Tensor, max_length: int) -> torch.Tensor:
        """Right-pad `tensor` to `max_length` with the pad token id (the processing class's, else the model's)."""
        if self.processing_class is not None and hasattr(self.processing_class, "pad_token_id"):
            # Without a pad token, the EOS token pads.
            pad_token_id = (
                self.processing_class.pad_token_id
                if self.processing_class.pad_token_id is not None
                else self.processing_class.eos_token_id
            )
        elif getattr(getattr(self.model, "config", None), "pad_token_id", None) is not None:
            pad_token_id = self.model.config.pad_token_id
        else:
            raise ValueError(
                "Pad_token_id must be set in the configuration of the model, in order to pad tensors"
            )
        padded_tensor = pad_token_id * torch.ones(
            (tensor.shape[0], max_length), dtype=tensor.dtype, device=tensor.device
        )
        padded_tensor[:, : tensor.shape[-1]] = tensor
        return padded_tensor


Seq2SeqTrainer = HFLightningSeq2SeqTrainer

HFLightningSeq2SeqTrainer.__init__.__signature__ = _public_signature(HFLightningSeq2SeqTrainer.__init__)
