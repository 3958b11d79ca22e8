"""FLOPs of a training micro-batch and the device's peak FLOP/s, from Lightning's measuring parts.

FLOPs: Lightning's `measure_flops` (torch's `FlopCounterMode`) runs the forward and backward once, on the meta
device: the model's own code on a copy of it whose tensors are meta tensors (no data copied, hooks left out) and on
a meta copy of the first micro-batch, so nothing is computed, no weight, gradient or attribute of the model is
touched and no random number is drawn. Later
micro-batches scale that count by the size of their input (exact for a fixed shape; for padded text the linear
layers scale exactly and attention's quadratic part approximately). A model whose forward reads a value out of a
tensor (transformers' mask checks do) cannot run on meta; then the reference's own count is used:
`floating_point_ops` (6 x non-embedding parameters x input tokens for a transformers model), which the trainer
already sums into `state.total_flos`. With neither, FLOPs and MFU are absent.

Peak FLOP/s: Lightning's `get_available_flops` for the device and the precision the forward runs in (the plan's
autocast dtype, else the parameters' dtype; float32 counts as TF32 where matmuls use it). None on a CPU or an
unknown chip: MFU is then absent unless the user gives `Telemetry(peak_flops=...)`; never a figure of our own.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
from lightning.fabric.utilities.throughput import get_available_flops, measure_flops
from torch import nn

from hf_lightning.core.autocast import planned_autocast_dtype

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


def meta_flops_measurer(model: nn.Module, replicated: bool) -> Callable[[Mapping[str, Any]], int | None] | None:
    """The measurement the batch counter runs on its first micro-batch; None when the model's parameters are not
    whole on each process (FSDP, DeepSpeed, tensor parallelism: `replicated` False), where the reference's count is
    used."""
    if not replicated:
        return None
    return lambda inputs: measure_micro_batch_flops(model, inputs)


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


def begin_measuring(telemetry: Any, facade: Any, lightning_trainer: Any, setup_seconds: float) -> None:
    """Tell the trainer's `TelemetryMeter` what the fit runs on: the device, the processes, the precision and its
    peak FLOP/s (the user's `peak_flops` first), how FLOPs are counted and where figures are logged."""
    device = lightning_trainer.strategy.root_device
    plan = facade.plan
    dtype = compute_dtype(planned_autocast_dtype(plan.module), facade.model)
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
        measure_flops=meta_flops_measurer(facade.model, replicated=strategy in _REPLICATING_STRATEGIES),
        loggers=list(lightning_trainer.loggers),
        setup_seconds=setup_seconds,
    )
