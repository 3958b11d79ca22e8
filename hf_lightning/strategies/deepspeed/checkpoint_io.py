"""Checkpoint files of a DeepSpeed run: the engine's own checkpoint (`global_step<N>/`, `latest`) for the weights and
the optimizer, as the reference writes and reads them through DeepSpeed; `scheduler.pt` when the trainer steps its
own schedule. The engine resumes itself when the strategy builds it (`HFDeepSpeedStrategy._resume_engine`)."""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING, Any

from hf_lightning.data.model_inputs import is_peft_model
from hf_lightning.strategies.checkpoint_io import StrategyCheckpointIO

if TYPE_CHECKING:
    from hf_lightning.strategies.ports import CheckpointIOOwner


class DeepSpeedCheckpointIO(StrategyCheckpointIO):
    """The engine's checkpoint; every method that writes or loads it runs on all ranks."""

    loads_weights_before_training = False
    weights_files_required = False
    supports_background_writes = False

    def check_resumable(self, checkpoint: str) -> None:
        if not glob.glob(os.path.join(checkpoint, "global_step*")):
            raise ValueError(f"Can't find a valid checkpoint at {checkpoint}")

    def optimizer_files(self, checkpoint: str) -> list[str]:
        return []  # the engine reads its own optimizer state; scheduler.pt with it (`_resume_engine`)

    def load_best_weights(self, trainer: CheckpointIOOwner, best_dir: str) -> None:
        # lazy: Lightning's DeepSpeed strategy (and Lightning) load only when DeepSpeed runs
        from hf_lightning.strategies.deepspeed.strategy import load_engine_checkpoint

        load_engine_checkpoint(trainer.model_wrapped, best_dir, load_module_strict=not is_peft_model(trainer.model))

    def load_optimizer_and_scheduler(self, trainer: CheckpointIOOwner, files: Any) -> None:
        return None  # loaded with the engine's checkpoint when the strategy built the engine

    def save_optimizer_and_scheduler(self, trainer: CheckpointIOOwner, output_dir: str, reach: Any) -> None:
        # lazy: Lightning's DeepSpeed strategy (and Lightning) load only when DeepSpeed runs
        from hf_lightning.strategies.deepspeed.strategy import save_deepspeed_optimizer_and_scheduler

        save_deepspeed_optimizer_and_scheduler(
            trainer.model_wrapped, trainer.model, trainer.lr_scheduler, output_dir, should_save=trainer.args.should_save
        )

    def save_model(self, trainer: CheckpointIOOwner, output_dir: str, in_checkpoint: bool = False) -> None:
        """Consolidated weights (ZeRO-3 gathers), or the engine's checkpoint without the 16-bit gather."""
        # lazy: Lightning's DeepSpeed strategy (and Lightning) load only when DeepSpeed runs
        from hf_lightning.strategies.deepspeed.strategy import save_deepspeed_model

        save_deepspeed_model(trainer, output_dir)
