"""DDP the reference's way under Lightning: the user's model is wrapped, not the LightningModule."""

from __future__ import annotations

from lightning.pytorch.strategies import DDPStrategy


class MicroBatchDDPStrategy(DDPStrategy):
    """Wraps the user's model in DistributedDataParallel so every micro-batch forward goes through DDP."""

    def configure_ddp(self) -> None:
        module = self.model
        module.facade.model_wrapped = self._setup_model(module.model)
