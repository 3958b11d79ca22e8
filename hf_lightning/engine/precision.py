"""Mixed precision the reference's way: autocast around the model's forward only (R7.6).

accelerate wraps a prepared model's forward in `torch.autocast` and converts its outputs to float32,
so loss code outside the forward (label smoothing, `compute_loss_func`, a `compute_loss` override)
runs in float32. Lightning's mixed-precision plugins autocast the whole `training_step` instead; we
therefore keep Lightning's plugin only for what it must own (the fp16 gradient scaler) and autocast
the forward ourselves.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

from hf_lightning.core.autocast import autocast_forward, planned_autocast_dtype
from hf_lightning.translation.plan import ModuleSettings


def forward_autocast(model: torch.nn.Module, args: Any, settings: ModuleSettings):
    """A context in which `model`'s forward runs under the reference's autocast (a no-op in full precision).

    `settings`: the trainer's plan's module section (its `forward_autocast`); `args` gives the device."""
    dtype = planned_autocast_dtype(settings)
    if dtype is None:
        return contextlib.nullcontext()
    return autocast_forward(model, args.device.type, dtype)


@functools.cache
def forward_only_mixed_precision_class() -> type:
    """Lightning's fp16 plugin (loss scaling, unscale, skipped steps) without its step-wide autocast.

    Built on first use so that importing this module (evaluation does) does not import Lightning.
    """
    from lightning.pytorch.plugins.precision import MixedPrecision

    class ForwardOnlyMixedPrecision(MixedPrecision):
        def forward_context(self):  # type: ignore[override]
            return contextlib.nullcontext()

    return ForwardOnlyMixedPrecision


def lightning_precision_kwargs(precision: str) -> dict[str, Any]:
    """`lightning.Trainer` kwargs for the plan's precision: only the scaler is left to Lightning."""
    if precision == "16-mixed":
        return {"plugins": [forward_only_mixed_precision_class()("16-mixed", device="cuda")]}
    if precision == "bf16-mixed":
        return {"precision": "32-true"}
    return {"precision": precision}
