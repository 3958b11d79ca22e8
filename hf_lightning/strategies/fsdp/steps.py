"""FSDP's update: FSDP1's clipping over every rank's shard, generation synced once the model is sharded.

No Lightning import, so the facade can ask it before `train()`; FSDP2's DTensor gradients clip through torch's
own `clip_grad_norm_` (the base)."""

from __future__ import annotations

from torch import nn

from hf_lightning.strategies.fsdp.policies import fsdp1_clip_grad_norm, is_fsdp1_model, is_fsdp2_model
from hf_lightning.strategies.steps import StrategySteps


class FSDPSteps(StrategySteps):
    """FSDP1 or FSDP2 (`fully_shard`)."""

    def clip_gradients_norm(self, model: nn.Module, max_norm: float | None, inv_scale: float | None = None):
        if is_fsdp1_model(model):  # the norm over every rank's shard, as accelerate's FSDP1 clipping
            return fsdp1_clip_grad_norm(model, max_norm, inv_scale)
        return super().clip_gradients_norm(model, max_norm, inv_scale)

    def generation_syncs_processes(self, model: nn.Module) -> bool:
        # The reference's `is_fsdp_enabled`: a model FSDP wrapped or sharded (in training); not before.
        return is_fsdp1_model(model) or is_fsdp2_model(model)
