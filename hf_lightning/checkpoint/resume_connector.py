"""`ResumeConnector`: one `train()` call's resume state (the chosen checkpoint's files and where the run restarts).

The steps themselves are the functions of hf_lightning/checkpoint/resume.py; this connector holds what they share
across the run, the way Lightning's trainer keeps its checkpoint connector's state out of the trainer.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

import hf_lightning.checkpoint.resume as resume
from hf_lightning.core.protocols import RunLike, TrainerLike


class ResumeConnector:
    """Resuming one run: `prepare` at `train()` entry, then state, Lightning loops, optimizer, epochs."""

    def __init__(self, facade: TrainerLike, run: RunLike):
        self._facade = facade
        self._run = run
        self.files: resume.ResumeFiles | None = None  # read at train() entry; reused by every batch-size attempt
        self.point: resume.ResumePoint | None = None  # this attempt's fast-forward

    def prepare(self, resume_from_checkpoint: str | bool | None) -> None:
        """Choose the checkpoint, load the model weights and read its files (before the optimizer exists)."""
        self.files = resume.prepare_resume(self._facade, resume_from_checkpoint)

    def restore_trainer_state(self, values: Any) -> None:
        """Where the reference's `_init_training_state` runs: the checkpoint's `TrainerState` and fast-forward."""
        self.point = resume.restore_trainer_state(self._facade, self.files, values)

    def position_lightning_loops(self, lightning_trainer: pl.Trainer) -> None:
        """Start Lightning's epoch and step counters where the checkpoint stopped (before `fit`)."""
        resume.position_lightning_loops(self._facade, self.point, lightning_trainer)

    def load_optimizer_and_scheduler(self, lightning_trainer: pl.Trainer) -> None:
        """Load the optimizer, scheduler and scaler states into what Lightning set up, through the facade's
        overridable `_load_optimizer_and_scheduler(checkpoint folder)`, called when resuming, as the reference."""
        if self.point is not None:
            self._facade._load_optimizer_and_scheduler(self.point.files.checkpoint)

    def enter_epoch(self, epoch: int) -> int:
        """The micro-batch index epoch `epoch` continues from (-1: its start); fast-forwards the resumed one."""
        return resume.enter_epoch(self._facade, self.point, self._run, epoch)

    def skip_replayed_batches(self, dataloader_iter: Any) -> None:
        """Discard the batches a plain DataLoader could not skip (first window of the resumed epoch only)."""
        point = self.point  # checked here: once per update, and nearly always nothing to do
        if point is not None and point.replay:
            resume.skip_replayed_batches(point, dataloader_iter)

    def sync_rng_after_first_window(self) -> None:
        """Restore the checkpoint's RNG once the resumed epoch's first window is fetched."""
        point = self.point
        if point is not None and point.rng_pending:
            resume.sync_rng_after_first_window(self._facade, point)
