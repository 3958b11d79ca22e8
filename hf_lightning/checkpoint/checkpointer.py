"""`Checkpointer`: a trainer's checkpoint saves, from the step boundary to the rotated folder on disk.

It owns the save protocol (CKPT-3.6, atomic): a hidden scratch folder next to the checkpoints receives every file,
the files are fsynced, the completion marker is written last, the folder is renamed to `checkpoint-<step>`, and only
then are old checkpoints rotated out. It also owns the background writer of Lightning's `AsyncCheckpointIO`
(checkpoint/async_writes.py), which runs the same protocol on a copy of the state, the best-checkpoint path the
trainer state names, and the end-of-training rotation.

What goes into the folder flows down: the trainer's state is gathered as plain data on the training thread
(checkpoint/staging.py: live for a synchronous save, copied for a background one) and written with the strategy's
checkpoint I/O. Where a subclass overrides a save hook (`save_model`, `_save`, `_save_optimizer_and_scheduler`,
`_save_scaler`, `_save_rng_state`), the hooks write the files instead, on the training thread, synchronously even
with background writes requested. One `Checkpointer` lives as long as its trainer, as Lightning's trainer keeps its
checkpoint connector: a write started by one `train()` is joined by the next.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Mapping
from types import MethodType
from typing import Any, Protocol

from hf_lightning.checkpoint.async_writes import (
    BackgroundCheckpointWriter,
    PendingSave,
    async_writes_enabled,
    copy_state,
    refuse_background_writes_without_support,
)
from hf_lightning.checkpoint.durability import fsync_tree, writeback_while_writing
from hf_lightning.checkpoint.fault_points import reach
from hf_lightning.checkpoint.files import (
    checkpoints_to_delete_at_train_end,
    clean_scratch_folders,
    commit_checkpoint,
    delete_checkpoint,
    list_checkpoints,
    rotate_checkpoints,
    temporary_checkpoint_dir,
    write_complete_marker,
)
from hf_lightning.checkpoint.output_folder import write_failure
from hf_lightning.checkpoint.run_lock import claim_output_dir, release_output_dir
from hf_lightning.checkpoint.staging import (
    StagedCheckpoint,
    StagingSource,
    stage,
    write_model_folder,
    write_records,
    write_rng_state,
    write_scaler,
)
from hf_lightning.core.blocked_time import blocked_by
from hf_lightning.core.checkpoint_files import checkpoint_folder_name
from hf_lightning.core.enums import enum_value
from hf_lightning.strategies.distributed import barrier

logger = logging.getLogger(__name__)

# The save strategies under which the best metric's step is tracked (and its folder kept by rotation).
BEST_TRACKING_SAVE_STRATEGIES = ("steps", "epoch", "best")
# The reference's save hooks that write a checkpoint's files; an override of any makes the trainer's hooks write them.
SAVE_HOOKS = ("save_model", "_save", "_save_optimizer_and_scheduler", "_save_scaler", "_save_rng_state")


class SaveHooks(StagingSource, Protocol):
    """The trainer as its checkpoint saves see it: what a staged save reads (`StagingSource`), the reference's save
    hooks a subclass may override (with the base ones to tell an override), and where a save goes and is announced."""

    control: Any  # callbacks.state.TrainerControl
    callback_handler: Any  # callbacks' CallbackHandler: on_save
    hp_search_backend: Any  # None outside a search: flos are stored then
    _base_save_hooks: Mapping[str, Callable[..., Any]]  # hook name -> the base class's function

    @property
    def _checkpoint_io(self) -> Any: ...  # strategies.checkpoint_io.StrategyCheckpointIO of the planned strategy
    def _save_checkpoint(self, model: Any, trial: Any) -> None: ...
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None: ...
    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None: ...
    def _save_optimizer_and_scheduler(self, output_dir: str) -> None: ...
    def _save_scaler(self, output_dir: str) -> None: ...
    def _save_rng_state(self, output_dir: str) -> None: ...
    def store_flos(self) -> None: ...
    def _get_output_dir(self, trial: Any) -> str: ...
    def _push_checkpoint(self, final_dir: str) -> None: ...


class Checkpointer:
    """The checkpoint saves of one trainer (the facade, through its save hooks)."""

    def __init__(self, trainer: SaveHooks):
        self.trainer = trainer
        self.writer: BackgroundCheckpointWriter | None = None  # made by the first save of an async run
        self._run_locks: dict[str, str] = {}  # run folder -> this run's lock for it (checkpoint/run_lock.py)
        self._submitted_state: Any = None  # the trainer state of a save just handed to the background writer
        self._unannounced_state: Any = None  # ... whose on_save waits for the folder's commit

    # ---- one save -------------------------------------------------------------------------------------------

    def save_at_step_boundary(self, trial: Any) -> None:
        """The step boundary's save: the trainer's overridable `_save_checkpoint`, then `on_save` on every process once
        the folder it announces is complete on disk. A background write's `on_save` waits for its commit
        (`announce_committed_save`), with the trainer state of its step."""
        trainer = self.trainer
        # The time training stands still for the save (with AsyncCheckpointIO: the copy off the device).
        with blocked_by(trainer, "checkpoint"):
            self._submitted_state = None
            if self._overridden("_save_checkpoint"):
                trainer._save_checkpoint(trainer.model, trial)
            else:  # the base `_save_checkpoint` is this save
                self.save(trial)
            submitted, self._submitted_state = self._submitted_state, None
            if submitted is not None and self.writer is not None and self.writer.pending:
                self._unannounced_state = submitted
                trainer.control.should_save = False  # this step's save is done (what on_save's handler resets)
                return
            # Committed already (synchronous, or a background write a Hub push waited for).
            state = trainer.state if submitted is None else submitted
            trainer.control = trainer.callback_handler.on_save(trainer.args, state, trainer.control)

    def announce_committed_save(self, collective: bool = True) -> None:
        """`on_save` for a background write once it is committed on disk, on every process at the same step boundary
        (one gloo all-reduce per step while a write is in flight under several processes; none otherwise). Called at
        each step boundary and after each wait for the writer. `collective=False`: the writer was just waited for.
        The save decision of the step in progress is kept: the save announced is an earlier one."""
        if self._unannounced_state is None:
            return
        writer = self.writer
        if writer is not None and writer.pending:
            if not writer.all_finished(collective):
                return
            writer.wait()  # joins the finished thread; a failed write is raised here
        trainer = self.trainer
        state, self._unannounced_state = self._unannounced_state, None
        should_save = trainer.control.should_save
        trainer.control = trainer.callback_handler.on_save(trainer.args, state, trainer.control)
        trainer.control.should_save = should_save or trainer.control.should_save

    def save(self, trial: Any) -> None:
        """Write `checkpoint-<global_step>` atomically, then rotate old checkpoints (CKPT-3.6). All ranks.

        Order as the reference: flos, best checkpoint path, model files, optimizer / scheduler / scaler / RNG,
        trainer state; then (ours) fsync, completion marker, rename into place; then rotation. With Lightning's
        `AsyncCheckpointIO` plugin the files are written, committed and rotated by the background writer once the
        state is copied off the device.
        """
        trainer = self.trainer
        writer = self._background_writer()
        if writer is not None:
            writer.wait()  # a second save starts once the first is committed (its failure is raised here)
            self.announce_committed_save(collective=False)
        # An overriding hook needs the live trainer: that save is written on the training thread.
        hooks_write = not self._plain_io() or any(self._overridden(name) for name in SAVE_HOOKS)
        if trainer.hp_search_backend is None and trial is None:
            trainer.store_flos()
        run_dir = trainer._get_output_dir(trial=trial)
        final_dir = os.path.join(run_dir, checkpoint_folder_name(trainer.state.global_step))
        token = _shared_token()
        temporary_dir = temporary_checkpoint_dir(run_dir, trainer.state.global_step, token)
        should_save = trainer.args.should_save
        previous_best = trainer.state.best_model_checkpoint
        try:
            if should_save:
                if trainer._training_run is not None:  # the folder may first appear now (a trial's run folder)
                    os.makedirs(run_dir, exist_ok=True)
                    self.claim_run_dir(run_dir, refuse_others=False)
                shutil.rmtree(temporary_dir, ignore_errors=True)
                os.makedirs(temporary_dir)
            barrier()
            self._update_best_model_checkpoint(run_dir, final_dir)
            if writer is not None:
                refuse_background_writes_without_support(trainer._checkpoint_io)
            if writer is not None and not hooks_write:
                staged = stage(trainer, copy_tensors=copy_state)
                pending = PendingSave(run_dir, final_dir, temporary_dir, token, previous_best)
                writer.submit(staged, pending, self, trainer.state)
                self._submitted_state = staged.state
                if trainer.plan.hub.push_to_hub:  # the push reads the committed folder: wait, then push from here
                    writer.wait()
                    trainer._push_checkpoint(final_dir)
                return
            # A process whose filesystem holds no writer's scratch folder (another node's disk, no
            # save_on_each_node) writes its RNG file straight into checkpoint-N there, as the reference does.
            rng_dir = temporary_dir if should_save or os.path.isdir(temporary_dir) else final_dir
            if hooks_write:
                staged = self.write_through_hooks(temporary_dir, rng_dir)
            else:
                staged = stage(trainer)
                self.write_files(staged, temporary_dir, rng_dir)
            barrier()
            if should_save:
                self.commit(staged, temporary_dir, final_dir, token)
        except BaseException as error:
            trainer.state.best_model_checkpoint = previous_best
            failure = None
            if should_save and isinstance(error, (OSError, RuntimeError)):
                # torch says "unexpected pos" for a full disk; name output_dir and the system's reason instead.
                failure = write_failure(run_dir, os.path.basename(final_dir), temporary_dir, error)
            if should_save:
                # Every scratch folder of this save goes (an existing folder moved aside comes back).
                clean_scratch_folders(run_dir, token, own_too=True)
            if failure is not None:
                raise failure from error
            raise
        with blocked_by(trainer, "hub"):  # what of a Hub push runs before training goes on (trainer/hub_methods.py)
            trainer._push_checkpoint(final_dir)
        if should_save:
            self.rotate_after_save(staged, run_dir, final_dir, token)
        barrier()  # no process announces the folder (on_save) before the saving process has committed it

    def save_copy(self, root: str) -> str:
        """A complete `checkpoint-<global_step>` under `root` beside the run's own (a Ray Tune trial's checkpoint): the
        same files and commit as a save, no rotation, no `on_save`. One process (the reference's trials are)."""
        trainer = self.trainer
        final_dir = os.path.join(root, checkpoint_folder_name(trainer.state.global_step))
        token = str(os.getpid())
        temporary_dir = temporary_checkpoint_dir(root, trainer.state.global_step, token)
        os.makedirs(temporary_dir)
        if not self._plain_io() or any(self._overridden(name) for name in SAVE_HOOKS):
            staged = self.write_through_hooks(temporary_dir, temporary_dir)
        else:
            staged = stage(trainer)
            self.write_files(staged, temporary_dir)
        self.commit(staged, temporary_dir, final_dir, token)
        return final_dir

    def write_files(self, staged: StagedCheckpoint, temporary_dir: str, rng_dir: str | None = None) -> None:
        """Every file of one staged checkpoint into `temporary_dir` (model, optimizer, scheduler, scaler, RNG, data
        position, state), the optimizer's with the strategy's checkpoint I/O; the RNG file into `rng_dir` when given.
        The disk starts writing them while the rest is serialised."""
        with writeback_while_writing(temporary_dir) as start_writeback:
            if staged.should_save:
                write_model_folder(
                    temporary_dir, staged.model, staged.model_state, staged.processing_class, staged.data_collator,
                    staged.training_args,
                )  # fmt: skip
            start_writeback()
            if not staged.save_only_model:
                if staged.should_save:
                    io = self.trainer._checkpoint_io
                    io.write_optimizer_and_scheduler(staged.optimizer_state, staged.scheduler_state, temporary_dir, reach)
                start_writeback()
                if staged.scaler_state is not None:
                    write_scaler(temporary_dir, staged.scaler_state)
                write_rng_state(rng_dir or temporary_dir, staged.rng_states, staged.world_size, staged.process_index)
            write_records(staged, temporary_dir, rng_dir)

    def write_through_hooks(self, temporary_dir: str, rng_dir: str) -> StagedCheckpoint:
        """The files written by the trainer's save hooks (a subclass overrides one), on the training thread, then
        the records staged after them and written; returns the records."""
        trainer = self.trainer
        with writeback_while_writing(temporary_dir) as start_writeback:
            trainer.save_model(temporary_dir, _internal_call=True)
            start_writeback()
            if not trainer.plan.checkpointing.save_only_model:
                trainer._save_optimizer_and_scheduler(temporary_dir)
                start_writeback()
                trainer._save_scaler(temporary_dir)
                trainer._save_rng_state(rng_dir)
            staged = stage(trainer, files=False)
            write_records(staged, temporary_dir, rng_dir)
        return staged

    def commit(self, staged: StagedCheckpoint, temporary_dir: str, final_dir: str, token: str) -> None:
        """Make the written files durable, write the completion marker, rename the folder into place."""
        reach("fsync")
        # The folder's own entries are made durable once, by the marker's write, before the rename commits.
        fsync_tree(temporary_dir, include_root=False)
        reach("marker")
        write_complete_marker(temporary_dir, staged.global_step, staged.total_train_batch_size)
        commit_checkpoint(temporary_dir, final_dir, token)

    def rotate_after_save(self, staged: StagedCheckpoint, run_dir: str, final_dir: str, token: str) -> None:
        """After a commit: tidy other saves' scratch folders, then delete checkpoints beyond the limit."""
        # Scratch of killed saves first, so a restored aside folder takes part in the rotation.
        clean_scratch_folders(run_dir, token)
        reach("rotate")
        rotate_checkpoints(
            run_dir, staged.save_total_limit, staged.state.best_model_checkpoint, newest=final_dir, token=token
        )

    def _update_best_model_checkpoint(self, run_dir: str, final_dir: str) -> None:
        # The reference sets the path once the best step's folder exists; the folder being written now exists
        # under its final name only after the commit, and trainer_state.json must already name it.
        state = self.trainer.state
        best_step = state.best_global_step
        if enum_value(self.trainer.plan.checkpointing.save_strategy) not in BEST_TRACKING_SAVE_STRATEGIES or not best_step:
            return
        best_dir = os.path.join(run_dir, checkpoint_folder_name(best_step))
        if best_dir == final_dir or os.path.exists(best_dir):
            state.best_model_checkpoint = best_dir

    # ---- the runs writing into a folder ------------------------------------------------------------------------

    def claim_run_dir(self, run_dir: str, refuse_others: bool = True) -> None:
        """Hold this run's lock in `run_dir` (once), so no other run tidies this run's scratch folders away; another
        live run there is refused (before training) or warned about (checkpoint/run_lock.py)."""
        if run_dir not in self._run_locks:
            lock = claim_output_dir(run_dir, refuse_others)
            if lock is not None:
                self._run_locks[run_dir] = lock

    def release_run_dirs(self) -> None:
        """At the end of `train()`: remove this run's locks."""
        for lock in self._run_locks.values():
            release_output_dir(lock)
        self._run_locks.clear()

    # ---- the end of training ----------------------------------------------------------------------------------

    def rotate_at_train_end(self, trial: Any) -> None:
        """With `save_total_limit == 1` and a best checkpoint, delete every other checkpoint (the reference's end of
        training)."""
        trainer = self.trainer
        state, limit = trainer.state, trainer.plan.checkpointing.save_total_limit
        if not trainer.args.should_save or state.best_model_checkpoint is None:
            return
        run_dir = trainer._get_output_dir(trial)
        checkpoints = list_checkpoints(run_dir)
        doomed = checkpoints_to_delete_at_train_end(checkpoints, limit, state.best_model_checkpoint)
        if limit == 1 and len(checkpoints) > 1 and not doomed:
            # Only when the best folder is gone; the reference raises FileNotFoundError here.
            logger.warning(
                f"save_total_limit=1: the best checkpoint {state.best_model_checkpoint} is not in {run_dir}; "
                "no checkpoint was deleted at the end of training."
            )
        for path in doomed:
            logger.info(f"Deleting older checkpoint [{path}] due to plan.checkpointing.save_total_limit")
            # Only the processes allowed to save get here, so no collective: the token is this process's pid.
            delete_checkpoint(path, str(os.getpid()))

    # ---- who writes -----------------------------------------------------------------------------------------------

    def _overridden(self, name: str) -> bool:
        """Whether the trainer's `name` is not the base hook (a subclass, a library's class or the instance overrides
        it); read at each save, so a later class patch counts."""
        hook = getattr(self.trainer, name)  # as the instance resolves it: a function set on it has no `__func__`
        return not isinstance(hook, MethodType) or hook.__func__ is not self.trainer._base_save_hooks[name]

    def _plain_io(self) -> bool:
        """Whether the strategy writes a staged checkpoint: its I/O takes plain state (one process or DDP); a sharded
        strategy's hooks gather across ranks from the live model."""
        return self.trainer._checkpoint_io.supports_background_writes

    # ---- background writes ----------------------------------------------------------------------------------

    def _background_writer(self) -> BackgroundCheckpointWriter | None:
        """The background writer when the running `train()` has `AsyncCheckpointIO`, else None."""
        run = self.trainer._training_run
        if run is None or not run.fitting or not async_writes_enabled(run.lightning_trainer):
            return None
        if self.writer is None:
            self.writer = BackgroundCheckpointWriter()
        return self.writer

    def wait_for_pending_write(self, raise_failure: bool = True) -> None:
        """Block until a background write is committed (no-op without one). `raise_failure=False` (an error is
        already propagating) logs a failed write instead of raising it."""
        if self.writer is None:
            return
        try:
            self.writer.wait()
        except Exception:
            self._unannounced_state = None
            if raise_failure:
                raise
            logger.exception("A background checkpoint write failed while training was ending with an error.")
        if raise_failure:
            self.announce_committed_save(collective=False)
        self._unannounced_state = None


def _shared_token() -> str:
    """A name part for this save's scratch folders that every rank agrees on: the pid of rank 0."""
    import torch.distributed as dist

    token = [str(os.getpid())]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(token, src=0)
    return token[0]
