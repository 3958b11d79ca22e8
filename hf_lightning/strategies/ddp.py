"""DDP the reference's way under Lightning: the user's model is wrapped, not the LightningModule.

Lightning's `DDPStrategy` wraps the LightningModule, so DDP's forward (which arms gradient reduction)
would run once per `training_step`, i.e. once per accumulation window, while we run several
forward/backward passes inside it. The reference wraps the model and runs every micro-batch through
DDP's forward, skipping the all-reduce (`no_sync`) on all but the window's last micro-batch. So this
strategy wraps the user's model, hands the wrapper to the facade as `model_wrapped` (what
`training_step` / `compute_loss` receive, as in the reference), and leaves the LightningModule
unwrapped, which makes Lightning call its `training_step` directly.
"""

from __future__ import annotations

from lightning.pytorch.strategies import DDPStrategy


class MicroBatchDDPStrategy(DDPStrategy):
    """`DDPStrategy` whose DistributedDataParallel wraps the user's model inside the LightningModule."""

    def configure_ddp(self) -> None:
        module = self.model
        module.adopt_wrapped_model(self._setup_model(module.model), as_model=False)
