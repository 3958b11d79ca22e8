"""What a strategy does at each update, and what the engine asks of it, so `engine/` never asks which one runs.

Lightning gives gradient clipping to the strategy and its precision plugin (Fabric's
`Strategy.clip_gradients_norm`); here each strategy's `StrategySteps` clips, reads the learning rate the step
used, and answers the engine's questions (the dtype inputs take, whether generation must sync processes, whether
the model is placed by the engine). `steps_for(plan)` (strategies/build.py) chooses it from the plan, as
`checkpoint_io_for` chooses the checkpoint I/O, because evaluate() / predict() before `train()` ask too and a
one-device run keeps Lightning's own `SingleDeviceStrategy`. This base is one device or DDP replicas (every
process holds every parameter whole); FSDP, tensor parallelism and DeepSpeed override what they do differently.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def lightning_update_is_plain(strategy: Any) -> bool:
    """Whether Lightning's strategy and precision plugin add nothing around backward and the optimizer step but hook
    calls: its plain one-device strategy in full precision (others scale, sync or hand the step to an engine)."""
    # lazy: this module is loaded by `from hf_lightning import Trainer`, which does not import Lightning
    from lightning.pytorch.plugins.precision import Precision
    from lightning.pytorch.strategies import SingleDeviceStrategy

    return type(strategy) is SingleDeviceStrategy and type(strategy.precision_plugin) is Precision


def clip_scaled_grad_norm(
    parameters: list[nn.Parameter], max_norm: float | None, inv_scale: float | None = None, norm_type: float = 2.0
) -> torch.Tensor:
    """Clip `parameters`' gradients at `max_norm` (None: measure only) and return their total norm before clipping.

    With fp16 the gradients are still scaled by `1 / inv_scale` (Lightning unscales inside `optimizer.step()`):
    the norm is measured on unscaled values and the scaled gradients are clipped by the same factor, which is what
    unscale-then-clip does."""
    if inv_scale is None:
        limit = float("inf") if max_norm is None else max_norm
        return torch.nn.utils.clip_grad_norm_(parameters, limit, norm_type=norm_type)
    norm = torch.nn.utils.get_total_norm([p.grad for p in parameters], norm_type) * inv_scale
    if max_norm is not None:
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
    return norm


class StrategySteps:
    """One device or DDP replicas: torch's clipping over the local gradients, the scheduler's learning rate."""

    # The engine (DeepSpeed) places the model on its device: the trainer does not move it at construction.
    engine_places_model = False

    def clip_gradients_norm(
        self, model: nn.Module, max_norm: float | None, inv_scale: float | None = None
    ) -> torch.Tensor | float | None:
        """Clip the gradients of `model` (what the trainer steps) at `max_norm` (None: measure only) and return
        the norm before clipping, unscaled by `inv_scale` under fp16 (the reference logs it)."""
        parameters = [p for p in model.parameters() if p.grad is not None]
        return clip_scaled_grad_norm(parameters, max_norm, inv_scale)

    def learning_rate(self, optimizer: Any, scheduler: Any, *, from_optimizer: bool) -> float:
        """The learning rate of the last update: the optimizer's first group for a schedule that waits for
        metrics (`from_optimizer`), else the scheduler's last one."""
        last_lr = optimizer.param_groups[0]["lr"] if from_optimizer else scheduler.get_last_lr()[0]
        return last_lr.item() if torch.is_tensor(last_lr) else last_lr

    def input_dtype(self, args: Any) -> torch.dtype | None:
        """The dtype floating inputs take on their way to the model; None: they keep theirs."""
        return None

    def generation_syncs_processes(self, model: nn.Module) -> bool:
        """Whether `generate()` must run every step on every process (the weights are sharded)."""
        return False
