"""The state a `skip` run guard goes back to: the run as it stood at a recent decision, kept in CPU memory.

`RunGuard("skip")` decides where `rollback` does (at training logs), so the update of an offending window has been
applied by then. At train start, and at a decision that accepts every update once the time budget below allows a
new copy, the run is staged as one checkpoint in CPU memory (checkpoint/staging.py's `stage`, the copy a background
save makes: one copy of the model and the optimizer state), with the training-loss window of that step. When a
later decision finds an offending window, the staged checkpoint is written atomically into a private folder of the
run's output directory (`.run-guard-snapshot`, never taken for a `checkpoint-N`, removed at the end of `train()`),
and the run rolls back to it as `rollback` does: the updates after the snapshot are made again without the
offending window.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import TYPE_CHECKING, Any, Protocol

from hf_lightning.checkpoint.async_writes import copy_state
from hf_lightning.checkpoint.staging import StagedCheckpoint, StagingSource, stage
from hf_lightning.strategies.distributed import barrier

if TYPE_CHECKING:
    from hf_lightning.args.training_args import TrainingArguments
    from hf_lightning.checkpoint.checkpointer import Checkpointer
    from hf_lightning.strategies.checkpoint_io import StrategyCheckpointIO
    from hf_lightning.translation.plan import Plan

SNAPSHOT_FOLDER = ".run-guard-snapshot"


class SnapshotSource(StagingSource, Protocol):
    """The trainer as the `skip` snapshot sees it: what checkpoint/staging.py's `stage` reads of it (which stages
    the run), the strategy's file layout and the checkpoint writer."""

    args: TrainingArguments
    plan: Plan
    _checkpointer: Checkpointer

    @property
    def _checkpoint_io(self) -> StrategyCheckpointIO: ...


# A snapshot is renewed once the time since the last one is this many times what taking it cost, so snapshots take
# at most 1% of the run's time; an event then makes again the updates since the snapshot, which can span several
# decision windows (the weights and logs do not depend on which snapshot the run goes back to).
RENEW_AFTER_COST_TIMES = 100.0


class GuardSnapshot:
    """One staged checkpoint of the run (CPU copies) and the logging state of its step, or nothing yet."""

    def __init__(self) -> None:
        self.staged: StagedCheckpoint | None = None
        self._run_values: tuple | None = None  # the loss window, loss total and train()-wide counters
        self._cost = 0.0  # seconds the last snapshot took
        self._taken_at = 0.0  # perf_counter() when it was taken

    def due(self) -> bool:
        """Whether this process would renew the snapshot now (the time budget above); the processes agree on it
        through the decision's all-reduce (engine/run_guard.py)."""
        return self.staged is None or time.perf_counter() - self._taken_at >= RENEW_AFTER_COST_TIMES * self._cost

    @property
    def step(self) -> int | None:
        return None if self.staged is None else self.staged.global_step

    def clear(self) -> None:
        self.staged, self._run_values = None, None

    def take(self, trainer: SnapshotSource, run: Any) -> None:
        """Stage the run as it stands now (a step boundary, or train start), replacing the previous snapshot."""
        started = time.perf_counter()
        self.clear()  # the previous copy goes before the new one is made: one copy held at a time
        self.staged = stage(trainer, copy_tensors=copy_state, whole=True)
        logging = run.logging
        self._run_values = (
            logging.loss.copy(), logging.total_loss_scalar, logging.globalstep_last_logged,
            run.start_time, run.initial_global_step, run.initial_num_input_tokens_seen,
        )  # fmt: skip
        self._taken_at = time.perf_counter()
        self._cost = self._taken_at - started

    def write(self, trainer: SnapshotSource, run_dir: str) -> str:
        """The staged checkpoint as a complete folder under `run_dir` (every process writes its RNG file; the saving
        process the rest, then commits): what the rollback's resume reads."""
        staged = self.staged
        folder = os.path.join(run_dir, SNAPSHOT_FOLDER)
        temporary = folder + ".tmp"
        token = str(os.getpid())
        if staged.should_save:
            shutil.rmtree(temporary, ignore_errors=True)
            os.makedirs(temporary)
        barrier()
        checkpointer = trainer._checkpointer
        checkpointer.write_files(staged, temporary)
        barrier()
        if staged.should_save:
            checkpointer.commit(staged, temporary, folder, token)
        barrier()
        return folder

    def continue_run(self, run: Any) -> None:
        """At the rolled-back fit's start: the loss window and total of the snapshot's step and the `train()`'s start,
        so the logged loss, `train_loss` and the speed metrics are those of one run without the window."""
        if self._run_values is None:
            return
        loss, total, last_logged, start_time, initial_step, initial_tokens = self._run_values
        run.logging.loss = loss.copy()
        run.logging.total_loss_scalar, run.logging.globalstep_last_logged = total, last_logged
        run.start_time, run.initial_global_step = start_time, initial_step
        run.initial_num_input_tokens_seen = initial_tokens


def refuse_unsnapshottable(trainer: SnapshotSource) -> None:
    """Before training: `skip` with what its snapshot cannot carry, named with the way out."""
    if not trainer._checkpoint_io.supports_background_writes:
        raise ValueError(
            "RunGuard(action='skip') keeps a CPU copy of the model and optimizer state, which this strategy's "
            "checkpoints (DeepSpeed, FSDP, tensor parallel: gathered across ranks) cannot be staged into. Use "
            "RunGuard(action='rollback') with save_steps a small multiple of logging_steps."
        )
    if trainer.plan.checkpointing.ignore_data_skip:
        raise ValueError(
            "RunGuard(action='skip') goes back to the state it kept and continues the data from where it stood; "
            "ignore_data_skip=True would start the epoch's data again. Set ignore_data_skip=False."
        )


def remove_snapshot_folder(trainer: SnapshotSource, run_dir: str) -> None:
    """At the end of `train()`: the private folder goes (the saving process)."""
    if trainer.args.should_save:
        shutil.rmtree(os.path.join(run_dir, SNAPSHOT_FOLDER), ignore_errors=True)
