"""FLOPs of a training micro-batch and the device's peak FLOP/s, without running the user's code unless asked.

FLOPs, by `Telemetry(flops=...)`:
- "auto" (default): for a transformers model whose config names its layers and width, the count from the config,
  the model's own code not run: 6 x N x tokens for the matmuls (N: the parameters a token passes through, the
  embedding tables left out but a head tied to them counted, as the reference's `floating_point_ops` leaves it
  out) plus attention's 12 x layers x hidden size x sequence length per token (the scores and the weighted sum,
  forward and backward; the usual dense-transformer count). Otherwise the reference's own `floating_point_ops`,
  which the trainer already sums into `state.total_flos` (none for a plain `nn.Module`).
- "measure": Lightning's `measure_flops` (torch's `FlopCounterMode`) runs the forward and backward once, on the meta
  device, at the first micro-batch: the model's own code on a copy whose tensors are meta tensors (no data copied,
  hooks left out), so no weight, gradient or attribute of the model is touched and no random number is drawn; but
  the forward's code does run once more (a global counter, a print, a log line in it show that). Later micro-batches
  scale the count by the size of their input. A model whose forward reads a value out of a tensor (transformers'
  mask checks do) cannot run on meta; then "auto"'s count is used.
- "reference": the reference's `floating_point_ops` only.
Each counts per micro-batch as `per_element x entries + per_position x entries x sequence length` of the main input.

Peak FLOP/s: Lightning's `get_available_flops` for the device and the precision the forward runs in (the plan's
autocast dtype, else the parameters' dtype; float32 counts as TF32 where matmuls use it). None on a CPU or an
unknown chip: MFU is then absent unless the user gives `Telemetry(peak_flops=...)`; never a figure of our own.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.utilities.throughput import get_available_flops, measure_flops
from torch import nn

from hf_lightning.core.autocast import planned_autocast_dtype

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from hf_lightning.engine.telemetry.meter import TelemetryMeter
    from hf_lightning.translation.plan import Plan

logger = logging.getLogger(__name__)


def _on_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty_like(value, device="meta")
    if isinstance(value, Mapping):
        return {key: _on_meta(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_meta(item) for item in value)
    return value


def _training_loss(output: Any) -> torch.Tensor:
    """What the backward starts from: the output's loss, else the sum of its first tensor (FLOPs are the same)."""
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(output, torch.Tensor):
        return output.sum()
    values = output.values() if isinstance(output, Mapping) else output
    return next(value for value in values if isinstance(value, torch.Tensor)).sum()


def _meta_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` whose parameters and buffers are meta tensors (no memory, no data copied) and whose hooks
    are gone: the measuring forward runs the model's own code, but what it changes (attributes, a list a test
    appends to) and what hooks would see (a user's activation capture) are the copy's, never the model's."""
    memo: dict[int, Any] = {}
    for parameter in model.parameters():
        memo[id(parameter)] = nn.Parameter(
            torch.empty_like(parameter, device="meta"), requires_grad=parameter.requires_grad
        )
    for buffer in model.buffers():
        memo[id(buffer)] = torch.empty_like(buffer, device="meta")
    copy_ = copy.deepcopy(model, memo)
    for module in copy_.modules():
        for hooks in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            getattr(module, hooks).clear()
    return copy_


def measure_micro_batch_flops(model: nn.Module, inputs: Mapping[str, Any]) -> int | None:
    """FLOPs of one forward and backward of `model` on a batch shaped like `inputs`, counted on the meta device;
    None when the model cannot run there (the error is logged at debug level)."""
    # A forward that draws random numbers on meta draws none, but a model's own Python code might; the stream the
    # training continues with stays the one it had.
    rng_state = torch.random.get_rng_state()
    try:
        copy_ = _meta_copy(model)
        meta_inputs = _on_meta(dict(inputs))
        flops = measure_flops(copy_, lambda: copy_(**meta_inputs), _training_loss)
    except Exception as error:  # any model code may fail on meta tensors; the reference's count takes over
        logger.debug(f"FLOPs not measurable on the meta device ({type(error).__name__}: {error}); "
                     "using the trainer's floating_point_ops")
        return None
    finally:
        torch.random.set_rng_state(rng_state)
    return flops or None


@dataclass(frozen=True)
class FlopsRule:
    """A micro-batch's FLOPs: `per_element` x the main input's entries + `per_position` x entries x its sequence
    length (the attention term); `source` says where the figures came from (the summary prints it)."""

    per_element: float
    per_position: float
    source: str


_LAYER_NAMES = ("num_hidden_layers", "n_layer", "num_layers")
_WIDTH_NAMES = ("hidden_size", "n_embd", "d_model")


def _config_value(config: Any, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _matmul_parameters(model: nn.Module) -> int:
    """Parameters a token's forward multiplies by: all but the embedding tables, plus an output head tied to one
    (its matmul runs though its weight is the input embedding's)."""
    embeddings = {id(module.weight) for module in model.modules() if isinstance(module, nn.Embedding)}
    count = sum(parameter.numel() for parameter in model.parameters() if id(parameter) not in embeddings)
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor) and id(weight) in embeddings:
        count += weight.numel()
    return count


def config_flops_rule(model: nn.Module) -> FlopsRule | None:
    """The count from a transformers model's config (no model code runs); None for an encoder-decoder model (two
    stacks, two sequence lengths) or a config without layers and width."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return None
    layers, width = _config_value(config, _LAYER_NAMES), _config_value(config, _WIDTH_NAMES)
    if layers is None or width is None:
        return None
    return FlopsRule(
        per_element=6.0 * _matmul_parameters(model),
        per_position=12.0 * layers * width,
        source=f"6 x N x tokens + attention 12 x {layers} layers x {width} x sequence length (model config)",
    )


def flops_rule_maker(
    model: nn.Module, replicated: bool, mode: str
) -> Callable[[Mapping[str, Any], int], FlopsRule | None] | None:
    """What the batch counter runs on its first micro-batch (its inputs and the main input's entries) to get the
    run's `FlopsRule`; None where the reference's count is used: `mode` "reference", or the model's parameters not
    whole on each process (FSDP, DeepSpeed, tensor parallelism: `replicated` False)."""
    if mode == "reference" or not replicated:
        return None
    from_config = config_flops_rule(model)

    def make(inputs: Mapping[str, Any], elements: int) -> FlopsRule | None:
        if mode == "measure":
            flops = measure_micro_batch_flops(model, inputs)
            if flops and elements:
                return FlopsRule(flops / elements, 0.0, "measure_flops on the meta device")
        return from_config

    return make


def compute_dtype(autocast_dtype: torch.dtype | None, model: nn.Module) -> torch.dtype:
    """The dtype the forward's matmuls run in: the autocast dtype, else the first floating parameter's."""
    if autocast_dtype is not None:
        return autocast_dtype
    for parameter in model.parameters():
        if parameter.is_floating_point():
            return parameter.dtype
    return torch.float32


def device_peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """Lightning's peak FLOP/s of one `device` in `dtype`; None where it knows none (a CPU, an unknown chip)."""
    if device.type not in ("cuda", "xla"):
        return None  # Lightning's table covers GPUs and TPUs only
    peak = get_available_flops(device, dtype)
    return float(peak) if peak else None


# The strategies whose processes each hold the whole model, so the meta measurement sees every parameter.
_REPLICATING_STRATEGIES = (None, "ddp")


def begin_measuring(
    telemetry: TelemetryMeter, plan: Plan, model: nn.Module, lightning_trainer: pl.Trainer, setup_seconds: float
) -> None:
    """Tell the trainer's `TelemetryMeter` what the fit of `model` under `plan` runs on: the device, the processes,
    the precision and its peak FLOP/s (the user's `peak_flops` first), how FLOPs are counted and where figures are
    logged."""
    device = lightning_trainer.strategy.root_device
    dtype = compute_dtype(planned_autocast_dtype(plan.module), model)
    peak, source = telemetry.settings.peak_flops, "Telemetry(peak_flops=...)"
    if peak is None:
        peak, source = device_peak_flops(device, dtype), "lightning get_available_flops"
    strategy = plan.strategy.name if plan.strategy is not None else None
    telemetry.begin_training(
        device=device,
        world_size=lightning_trainer.world_size,
        peak_flops=peak,
        peak_flops_source=source if peak is not None else None,
        compute_dtype=dtype,
        flops_rule=flops_rule_maker(
            model, replicated=strategy in _REPLICATING_STRATEGIES, mode=telemetry.settings.flops
        ),
        loggers=list(lightning_trainer.loggers),
        setup_seconds=setup_seconds,
    )
