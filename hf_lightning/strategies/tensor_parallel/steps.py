"""Tensor parallelism's update: the gradients clipped by their norm over every shard (the one-process norm)."""

from __future__ import annotations

from torch import nn

from hf_lightning.strategies.steps import StrategySteps
from hf_lightning.strategies.tensor_parallel.shards import clip_tp_grad_norm


class TensorParallelSteps(StrategySteps):
    """DTensor shards and plain (replicated) gradients."""

    def clip_gradients_norm(self, model: nn.Module, max_norm: float | None, inv_scale: float | None = None):
        parameters = [p for p in model.parameters() if p.grad is not None]
        return clip_tp_grad_norm(parameters, max_norm, inv_scale)
