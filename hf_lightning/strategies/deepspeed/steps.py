"""DeepSpeed's update: the engine clipped and stepped inside the window's last backward, so the trainer reads
the engine's norm and learning rate; float inputs take the engine's dtype; the engine places the model; ZeRO-3
generation syncs every process. No Lightning or deepspeed import, so the facade can ask before `train()`."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from hf_lightning.args.deepspeed_config import get_value
from hf_lightning.strategies.steps import StrategySteps

logger = logging.getLogger(__name__)


def engine_global_grad_norm(engine: Any) -> float | None:
    """The pre-clip gradient norm the engine measured in its last step, as a float (the reference logs it)."""
    norm = engine.get_global_grad_norm()
    return norm.item() if hasattr(norm, "item") else norm


def engine_learning_rate(scheduler: Any) -> float:
    """The reference's `_get_learning_rate` under DeepSpeed: 0 while fp16 loss-scale warm-up has not stepped yet."""
    try:
        last_lr = scheduler.get_last_lr()[0]
    except AssertionError as error:
        if "need to call step" not in str(error):
            raise
        logger.warning("tried to get lr value before scheduler/optimizer started stepping, returning lr=0")
        last_lr = 0
    return last_lr.item() if torch.is_tensor(last_lr) else last_lr


def deepspeed_input_dtype(args: Any) -> torch.dtype:
    """The reference's `hf_ds_config.dtype()`: bf16 / fp16 when the argument-time config enables it, else float32.

    Read from `args.hf_deepspeed_config` (the config after the arguments filled its "auto" values, before accelerate
    adds its own `fp16` / `bf16` sections), which is the config the reference takes its dtype from.
    """
    config = getattr(args, "hf_deepspeed_config", None) or {}
    if get_value(config, "bf16.enabled"):
        return torch.bfloat16
    if get_value(config, "fp16.enabled"):
        return torch.float16
    return torch.float32


class DeepSpeedSteps(StrategySteps):
    """The DeepSpeed engine around the user's model, at the plan's ZeRO stage."""

    engine_places_model = True

    def __init__(self, zero_stage: int | None):
        self.zero_stage = zero_stage

    def clip_gradients_norm(self, model: nn.Module, max_norm: float | None, inv_scale: float | None = None):
        # The engine clipped at the config's `gradient_clipping` inside its step: its norm.
        return engine_global_grad_norm(model)

    def learning_rate(self, optimizer: Any, scheduler: Any, *, from_optimizer: bool) -> float:
        return engine_learning_rate(scheduler)

    def input_dtype(self, args: Any) -> torch.dtype | None:
        return deepspeed_input_dtype(args)

    def generation_syncs_processes(self, model: nn.Module) -> bool:
        return self.zero_stage == 3
