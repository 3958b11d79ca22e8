"""Resuming training from a checkpoint: choosing it, loading it without running pickled code, fast-forwarding.

The reference's `train(resume_from_checkpoint=...)` (CKPT-3.13 to CKPT-3.15, R2.10), carried out by each run's
`Resumer`, which holds the checkpoint's files and the resume point, in steps at the reference's moments:
`prepare` at `train()` entry (choose the folder, load the weights, read every file up front so a bad one is
refused before training), `restore_trainer_state` where the reference's `_init_training_state` runs,
`position_lightning_loops` before `fit` (Lightning's epoch and step counters start where the checkpoint stopped),
`load_optimizer_and_scheduler` once Lightning has built them, then per epoch `enter_epoch` (skip the micro-batches
already trained on, at the sampler level) and `sync_rng_after_first_window` (the reference restores the RNG after
the first window of the resumed epoch, or at its start when nothing is skipped). The files it reads and the states
applied straight from them live below the facade's load hooks, in checkpoint/resume_files.py.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hf_lightning.callbacks import TrainerControl, TrainerState
from hf_lightning.checkpoint.data_resume import plan_continuation, read_saved_position
from hf_lightning.checkpoint.files import (
    checkpoint_problem,
    clean_scratch_folders,
    list_checkpoints,
    newest_valid_checkpoint,
    resume_problem,
    rng_state_problem,
    saved_samples_per_update,
    trainer_state_problem,
    weights_problem,
)
from hf_lightning.checkpoint.resume_files import ResumeFiles, saved_process_count, torch_files_to_restore
from hf_lightning.core.checkpoint_files import (
    COMPLETE_MARKER_NAME,
    OPTIMIZER_NAME,
    TRAINER_STATE_NAME,
)
from hf_lightning.core.reference_logging import reference_logger, warning_once
from hf_lightning.data.position_files import SKIPPED_WINDOWS_KEY, windows_left_out
from hf_lightning.strategies.checkpoint_io import optimizer_map_location
from hf_lightning.strategies.distributed import barrier
from hf_lightning.strategies.portable_state import has_model_state

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from hf_lightning.args.training_args import TrainingArguments
    from hf_lightning.callbacks import CallbackHandler
    from hf_lightning.strategies.checkpoint_io import StrategyCheckpointIO
    from hf_lightning.translation.plan import Plan

logger = logging.getLogger(__name__)

@dataclass
class ResumePoint:
    """Where the resumed run starts: the reference's `epochs_trained` and `steps_trained_in_current_epoch`."""

    files: ResumeFiles
    epochs_trained: int = 0
    steps_trained_in_current_epoch: int = 0
    entered: bool = False
    rng_pending: bool = False
    replay: int = 0
    data_state: Any | None = None  # the train loader's state at the resume point, when one was recorded


# ---- train() entry -------------------------------------------------------------------------------------------


def _newest_complete_checkpoint(args: Any) -> str:
    run_dir = args.output_dir
    if os.path.isdir(run_dir) and args.should_save:
        clean_scratch_folders(run_dir, token="")
    barrier()
    checkpoint, skipped = newest_valid_checkpoint(run_dir, resume=True) if os.path.isdir(run_dir) else (None, [])
    for path, problem in skipped:
        logger.warning(f"Skipping checkpoint {path} for resume_from_checkpoint=True: {problem}.")
    if checkpoint is None:
        raise ValueError(f"No valid checkpoint found in output directory ({run_dir})")
    return checkpoint


def _not_a_folder(checkpoint: str, output_dir: str) -> str:
    """The reference's words for a resume path that is no folder, with why and the checkpoints there are."""
    why = "it is a file, not a checkpoint folder" if os.path.exists(checkpoint) else "no such folder"
    # Each folder once, however it is spelt ("out/" as output_dir, "out/checkpoint-9" as the path).
    beside = os.path.dirname(os.path.normpath(checkpoint)) or "."
    places = dict.fromkeys(os.path.normpath(place) for place in (beside, output_dir))
    found = [path for place in places for _, path in list_checkpoints(place)]
    there = f"checkpoints there are: {', '.join(found)}" if found else f"no checkpoint-N folder in {' or '.join(places)}"
    return (
        f"Can't find a valid checkpoint at {checkpoint} ({why}); {there}. Pass one of them, or "
        "resume_from_checkpoint=True for the newest valid one in output_dir."
    )


def _refusal(checkpoint: str, problem: str) -> str:
    """The refusal of a checkpoint that `problem` (naming the file) makes unusable, with the way out."""
    return (
        f"Can't resume from {checkpoint}: {problem.rstrip('.')}. Resume from another checkpoint "
        "(resume_from_checkpoint=True takes the newest valid one in output_dir) or start a fresh run."
    )


def _explicit_checkpoint_problem(
    checkpoint: str, weights_required: bool, read_next: Collection[str]
) -> str | None:
    """What makes an explicitly named checkpoint unusable (the files decide, as for `resume_from_checkpoint=True`).

    A folder with our completion marker gets the full check but for the torch files in `read_next`; any other
    folder (the reference's, or a `save_only_model` one) is checked for what a resume reads: weights, trainer state
    and RNG files. The optimizer, scheduler and scaler files are read right after, and a bad one is refused naming it.
    """
    if os.path.exists(os.path.join(checkpoint, COMPLETE_MARKER_NAME)):
        return checkpoint_problem(checkpoint, read_next=read_next)
    # A sharded FSDP folder holds its weights in its distributed checkpoint, which every strategy reads.
    problem = weights_problem(checkpoint, required=not has_model_state(checkpoint)) if weights_required else None
    problem = problem or trainer_state_problem(os.path.join(checkpoint, TRAINER_STATE_NAME))
    for name in sorted(os.listdir(checkpoint)):
        if problem is None and name.startswith("rng_state") and name.endswith(".pth"):
            problem = rng_state_problem(os.path.join(checkpoint, name))
    return problem


def warn_on_process_count_change(args: Any, checkpoint: str) -> None:
    """Before training: say that a checkpoint saved by another number of processes resumes with mapped RNG states
    (process i takes the saving run's process i % saved), so random draws differ from an uninterrupted run."""
    saved = saved_process_count(checkpoint)
    if saved and saved != args.world_size and args.process_index == 0:
        logger.warning(
            f"{checkpoint} was saved by {saved} process(es) and this run has {args.world_size}: weights, optimizer, "
            "scheduler and the data position continue exactly, but each process restores the RNG state of process "
            f"(its rank % {saved}) of the saving run, so random draws (dropout, random data collators) differ from "
            "the uninterrupted run."
        )


def _warn_on_global_batch_change(checkpoint: str, samples_per_update: int, process_index: int) -> None:
    """Before training: a checkpoint saved with another global batch cannot continue its data where it stopped (the
    resume skips this run's first updates, which hold other samples), so the run is not the uninterrupted one."""
    saved = saved_samples_per_update(checkpoint)
    if saved is not None and saved != samples_per_update and process_index == 0:
        logger.warning(
            f"{checkpoint} was saved by a run taking {saved} samples per update and this run takes "
            f"{samples_per_update}: the resumed run skips its first updates by count, which do not hold the samples "
            "the saved run trained on, so its data (and learning curve) differ from the uninterrupted run. To resume "
            f"exactly, make per_device_train_batch_size x data-parallel processes x gradient_accumulation_steps = "
            f"{saved}."
        )


# ---- the trainer state (the reference's `_init_training_state`) ------------------------------------------------


def _warn_on_argument_mismatch(args: Any, state: TrainerState) -> None:
    """The reference's `compare_trainer_and_checkpoint_args`: a warning, never an error."""
    mismatches = [
        f"\n\t{name}: {getattr(args, name)} (from args) != {getattr(state, name)} (from trainer_state.json)"
        for name in ("logging_steps", "eval_steps", "save_steps")
        if getattr(args, name, None) is not None
        and getattr(state, name, None) is not None
        and getattr(args, name) != getattr(state, name)
    ]
    if state.train_batch_size is not None:
        saved = state.train_batch_size // max(1, args.n_gpu)
        if args.per_device_train_batch_size != saved:
            mismatches.append(
                f"\n\tper_device_train_batch_size: {args.per_device_train_batch_size} (from args) != {saved} "
                "(from trainer_state.json)"
            )
    if mismatches:
        warning_once(
            reference_logger("transformers.trainer_utils", __name__),
            "Warning: The following arguments do not match the ones in the `trainer_state.json` within the "
            "checkpoint directory: " + "".join(mismatches),
        )


class CallbackStateOwner(Protocol):
    """The trainer as the callback-state restore sees it: its callbacks, the resumed state and the control."""

    callback_handler: CallbackHandler
    state: TrainerState
    control: TrainerControl


def load_callback_state(trainer: CallbackStateOwner) -> None:
    """`restore_callback_states_from_checkpoint`: rebuild each stored callback as `cls(**args)` + attributes.

    As the reference: the new instance replaces the old one and goes to the end of the callback list; the stored
    `TrainerControl` replaces `trainer.control`; stored names without a current callback are warned about.
    """
    handler = trainer.callback_handler
    current = handler.callbacks + [trainer.control]
    not_found, rebuilt = [], []
    for name, data in (trainer.state.stateful_callbacks or {}).items():
        entries = data if isinstance(data, list) else [data]
        same_class = [callback for callback in current if callback.__class__.__name__ == name]
        if not same_class:
            not_found.append(name)
            continue
        for callback, entry in zip(same_class, entries):
            new_callback = type(callback)(**entry.get("args", {}))
            for attribute, value in entry.get("attributes", {}).items():
                setattr(new_callback, attribute, value)
            if isinstance(callback, TrainerControl):
                trainer.control = new_callback
            else:
                rebuilt.append(new_callback)
            handler.remove_callback(type(new_callback))
        logger.info("Continuing training from checkpoint, restoring any callbacks that were passed in")
    if not_found:
        logger.warning(
            f"Checkpoint included callbacks not included in current configuration. Ignoring. ({', '.join(not_found)})"
        )
    for callback in rebuilt:
        handler.add_callback(callback)


# ---- Lightning, optimizer and scheduler --------------------------------------------------------------------------


# ---- the resumed epoch ------------------------------------------------------------------------------------------


# ---- the component -------------------------------------------------------------------------------------------


class ResumeHooks(CallbackStateOwner, Protocol):
    """The trainer as the `Resumer` sees it: the arguments, the plan, the strategy's file layout and the
    reference-named load hooks a subclass may override."""

    args: TrainingArguments
    plan: Plan
    _train_batch_size: int  # `auto_find_batch_size`: the checkpoint's batch size is taken back

    @property
    def _checkpoint_io(self) -> StrategyCheckpointIO: ...
    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None: ...
    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None: ...
    def _load_scaler(self, checkpoint: str | None) -> None: ...
    def _load_rng_state(self, checkpoint: str | None) -> None: ...
    def _load_callback_state(self) -> None: ...


class ResumeRun(Protocol):
    """The run as the `Resumer` sees it: the count of updates done in the epoch, moved past the skipped windows."""

    updates_done_in_epoch: int


class Resumer:
    """Resuming one `train()` call: the chosen checkpoint's files (read at entry, shared by `auto_find_batch_size`
    attempts) and where this attempt restarts, with the steps that use them at the reference's moments.

    The weights, optimizer, scheduler, scaler, RNG and callback states load through the trainer's reference-named
    methods (`_load_from_checkpoint`, `_load_optimizer_and_scheduler`, `_load_scaler`, `_load_rng_state`,
    `_load_callback_state`), so a subclass's override is what runs.
    """

    def __init__(self, trainer: ResumeHooks, run: ResumeRun):
        self.trainer = trainer
        self.run = run
        self.files: ResumeFiles | None = None  # read at train() entry; reused by every batch-size attempt
        self.point: ResumePoint | None = None  # this attempt's fast-forward

    def prepare(self, resume_from_checkpoint: str | bool | None) -> None:
        """At `train()` entry: choose the checkpoint, load the model weights (before the optimizer exists) and read
        the optimizer, scheduler, scaler and RNG files, so a bad one is refused before training.

        `True` picks the newest complete `checkpoint-N` in `output_dir` (scratch folders of killed saves are tidied
        first, so a folder moved aside by a killed replacement counts again). Every file is read with
        `torch.load(weights_only=True)` or safetensors: a file that would run pickled code is refused (ValueError).
        """
        if resume_from_checkpoint is None or resume_from_checkpoint is False:
            return
        trainer = self.trainer
        args = trainer.args
        plan = trainer.plan
        if resume_from_checkpoint is True:
            checkpoint = _newest_complete_checkpoint(args)
        elif isinstance(resume_from_checkpoint, (str, os.PathLike)):
            checkpoint = os.fspath(resume_from_checkpoint)
        else:
            raise ValueError(
                f"resume_from_checkpoint={resume_from_checkpoint!r}: pass True (the newest checkpoint in output_dir), "
                "a checkpoint folder path, or None."
            )
        # The strategy's files: FSDP loads into the wrapped model and DeepSpeed's engine its own checkpoint at train
        # start, one process or DDP reads model.safetensors now (strategies/checkpoint_io.py).
        io = trainer._checkpoint_io
        if not os.path.isdir(checkpoint):
            raise ValueError(_not_a_folder(checkpoint, args.output_dir))
        io.check_resumable(checkpoint)
        state_path = os.path.join(checkpoint, TRAINER_STATE_NAME)
        if not os.path.isfile(state_path):
            raise ValueError(
                f"Can't resume from {checkpoint}: it has no {TRAINER_STATE_NAME}, so the step to continue from is "
                "unknown. Resume from a checkpoint written by Trainer.train(), or start a fresh run."
            )
        names = torch_files_to_restore(args, checkpoint, io.optimizer_files(checkpoint))
        warn_on_process_count_change(args, checkpoint)
        if resume_from_checkpoint is not True:  # True chose a checkpoint that passed checkpoint_problem just now
            problem = _explicit_checkpoint_problem(
                checkpoint, weights_required=io.weights_files_required, read_next=names
            ) or resume_problem(checkpoint)
            if problem is not None:
                raise ValueError(_refusal(checkpoint, problem))
        # Every torch file is read (and a bad one refused) before the model is touched.
        files = ResumeFiles(checkpoint, names=names)
        for name in files.names:
            try:
                files.loaded[name] = files.take(
                    name, optimizer_map_location(args) if name == OPTIMIZER_NAME else "cpu"
                )
            except ValueError as error:  # safe_torch_load's refusal, naming the file
                raise ValueError(_refusal(checkpoint, str(error))) from error
        if not plan.checkpointing.ignore_data_skip:
            try:
                files.data_position = read_saved_position(checkpoint, args.world_size, args.process_index)
            except ValueError as error:  # a damaged data-position file, named
                raise ValueError(_refusal(checkpoint, str(error))) from error
        if io.loads_weights_before_training:  # the reference's moment: before the optimizer exists
            trainer._load_from_checkpoint(checkpoint)
        if args.auto_find_batch_size:
            saved_batch_size = TrainerState.load_from_json(state_path).train_batch_size
            if saved_batch_size is not None:
                trainer._train_batch_size = saved_batch_size
        self.files = files

    def restore_trainer_state(self, values: Any, train_dataloader: Any = None) -> None:
        """Where the reference's `_init_training_state` runs: the checkpoint's `TrainerState` replaces the fresh one,
        callbacks are restored, and the fast-forward is computed: the reference's place, or the recorded data position
        where it applies to `train_dataloader` (checkpoint/data_resume.py)."""
        files = self.files
        if files is None:
            self.point = None
            return
        trainer = self.trainer
        point = self.point = ResumePoint(files)
        args = trainer.args
        plan = trainer.plan
        trainer.state = TrainerState.load_from_json(os.path.join(files.checkpoint, TRAINER_STATE_NAME))
        best = trainer.state.best_model_checkpoint
        if best is not None and not os.path.isdir(best):
            logger.warning(
                f"The best checkpoint {best} recorded in the resumed state does not exist anymore. Ignoring it for "
                "this run."
            )
            trainer.state.best_model_checkpoint = None
        _warn_on_argument_mismatch(args, trainer.state)
        if plan.checkpointing.restore_callback_states_from_checkpoint:
            trainer._load_callback_state()
        _warn_on_global_batch_change(files.checkpoint, values.total_train_batch_size, args.process_index)
        upe = values.num_update_steps_per_epoch
        # Windows a run guard took out of the path were drawn without an update (engine/guard_path.py).
        saved = files.data_position
        windows_done = trainer.state.global_step + windows_left_out(
            None if saved is None else saved.position, trainer.state.global_step
        )
        point.epochs_trained = int(windows_done // upe)
        if not plan.checkpointing.ignore_data_skip:
            point.steps_trained_in_current_epoch = (
                windows_done % upe
            ) * trainer.plan.module.gradient_accumulation_steps
            continuation = plan_continuation(
                files.data_position,
                train_dataloader,
                global_step=trainer.state.global_step,
                reference_epoch=point.epochs_trained,
                reference_batch=point.steps_trained_in_current_epoch,
            )
            point.epochs_trained = continuation.epoch
            point.steps_trained_in_current_epoch = continuation.batch
            point.data_state = continuation.state
        # The banner says where the run continues (hf_lightning/engine/training_banner.py).

    def skipped_windows(self) -> list[dict[str, int]]:
        """The windows a run guard took out of the path before the resumed checkpoint (its data position's record)."""
        saved = None if self.files is None else self.files.data_position
        return [] if saved is None else list(saved.position.get(SKIPPED_WINDOWS_KEY, []))

    def position_lightning_loops(self, lightning_trainer: pl.Trainer) -> None:
        """Start Lightning's counters at the checkpoint: `current_epoch` = epochs trained, `global_step` = the
        state's. Lightning then stops at the reference's `max_steps` / epoch count, and the module's epoch index is
        the reference's. Set before `fit`; Lightning resets neither counter when it starts without a Lightning
        checkpoint."""
        point = self.point
        if point is None:
            return
        fit_loop = lightning_trainer.fit_loop
        for progress in (fit_loop.epoch_progress.total, fit_loop.epoch_progress.current):
            progress.ready = progress.started = progress.processed = progress.completed = point.epochs_trained
        steps = fit_loop.epoch_loop.manual_optimization.optim_step_progress.total
        steps.ready = steps.completed = self.trainer.state.global_step
        fit_loop.epoch_loop._batches_that_stepped = self.trainer.state.global_step

    def load_optimizer_and_scheduler(self) -> None:
        """Once Lightning has built them: the optimizer and scheduler states, then the grad scaler's (the reference's
        `_load_optimizer_and_scheduler` and `_load_scaler`)."""
        if self.point is None:
            return
        checkpoint = self.point.files.checkpoint
        self.trainer._load_optimizer_and_scheduler(checkpoint)
        self.trainer._load_scaler(checkpoint)

    def enter_epoch(self, epoch: int) -> int:
        """At the start of epoch `epoch`: fast-forward when it is the resumed one (the run's count of updates done
        in the epoch moves past the skipped windows); returns the micro-batch index to continue from (-1: the
        epoch's start).

        The skipped micro-batches are dropped at the sampler level (no item is loaded). With nothing to skip (an
        epoch boundary, or `ignore_data_skip`) the RNG is restored now, before the epoch draws anything.
        """
        point, facade = self.point, self.trainer
        positions = getattr(facade.callback_handler.train_dataloader, "positions", None)
        if positions is not None:  # a checkpoint stands at a window boundary: the loader captures its state there
            positions.window = facade.plan.module.gradient_accumulation_steps
        if point is None or point.entered or epoch != point.epochs_trained:
            return -1
        point.entered = True
        skip = point.steps_trained_in_current_epoch
        if skip == 0:
            facade._load_rng_state(point.files.checkpoint)
            return -1
        accumulation = facade.plan.module.gradient_accumulation_steps
        # A pass that ended inside a window (an iterable's last batches) counts that window as an update.
        self.run.updates_done_in_epoch = -(-skip // accumulation)
        dataloader = facade.callback_handler.train_dataloader
        continue_from = getattr(dataloader, "continue_from", None)
        if point.data_state is not None and callable(continue_from):
            logger.info(f"  The train data continues from its recorded state before batch {skip} of epoch {epoch}.")
            # With a collator drawing random numbers in this process, the loader restores the state its next batch
            # was collated from, and the checkpoint's RNG follows right after that fetch (data/loader_position.py).
            point.rng_pending = not continue_from(skip, point.data_state, self._restore_rng_after_first_fetch)
            return skip - 1
        if callable(getattr(dataloader, "skip_first_batches_once", None)):
            dataloader.skip_first_batches_once(skip)
        else:
            logger.warning(
                f"The train DataLoader ({type(dataloader).__name__}) cannot skip batches by index; the {skip} batches "
                "already trained on in this epoch are loaded and discarded. Return hf_lightning's HFDataLoader from "
                "get_train_dataloader to skip them without loading."
            )
            point.replay = skip
        point.rng_pending = True
        return skip - 1

    def _restore_rng_after_first_fetch(self) -> None:
        point = self.point
        if point is not None:
            point.rng_pending = False
            self.trainer._load_rng_state(point.files.checkpoint)

    def skip_replayed_batches(self, dataloader_iter: Any) -> None:
        """Before the first window of the resumed epoch: discard the batches a plain DataLoader could not skip."""
        point = self.point  # checked here: once per update, and nearly always nothing to do
        if point is None or not point.replay:
            return
        remaining, point.replay = point.replay, 0
        for _ in range(remaining):
            next(dataloader_iter)

    def sync_rng_after_first_window(self) -> None:
        """After the resumed epoch's first window is fetched: restore the checkpoint's RNG (the reference's
        `rng_to_sync`), so every draw from here on equals the uninterrupted run's."""
        point = self.point
        if point is not None and point.rng_pending:
            point.rng_pending = False
            self.trainer._load_rng_state(point.files.checkpoint)
