"""Saving side of checkpoints for the trainer facade: `_save_checkpoint`, `save_model`, best-model tracking.

Writes the reference's layout (CKPT-3.2) atomically: everything goes into a hidden temporary
sibling folder, which gets a completion marker last and is then renamed to `checkpoint-<step>`; old checkpoints
are rotated out only after that. `training_args.bin` holds a plain, token-free dict, loadable with
`torch.load(weights_only=True)` (the reference pickles its `TrainingArguments`, token included).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import random
import shutil
import warnings
from typing import Any

from hf_lightning.callbacks import is_exportable_state
from hf_lightning.checkpoint.async_writes import PendingSave, background_writer_for
from hf_lightning.checkpoint.durability import fsync_tree, writeback_while_writing
from hf_lightning.checkpoint.files import (
    checkpoints_to_delete,
    checkpoints_to_delete_at_train_end,
    clean_scratch_folders,
    commit_checkpoint,
    delete_checkpoint,
    get_last_checkpoint,
    is_complete_checkpoint,
    list_checkpoints,
    reach,
    rotate_checkpoints,
    temporary_checkpoint_dir,
    write_complete_marker,
)
from hf_lightning.checkpoint.metrics_files import MetricsIOMixin
from hf_lightning.checkpoint.output_folder import apply_umask, write_failure
from hf_lightning.checkpoint.resume import warn_on_version_mismatch
from hf_lightning.checkpoint.save_imports import deepspeed_probe_skipped_while_unloaded
from hf_lightning.core.checkpoint_files import (
    SAFE_WEIGHTS_NAME,
    SCALER_NAME,
    TRAINER_STATE_NAME,
    TRAINING_ARGS_NAME,
    checkpoint_folder_name,
    rng_state_file_name,
)
from hf_lightning.core.enums import enum_value
from hf_lightning.data.dataset_position import DATASET_POSITION_NAME, write_position_record
from hf_lightning.strategies.build import checkpoint_io_for
from hf_lightning.strategies.checkpoint_io import StrategyCheckpointIO
from hf_lightning.strategies.distributed import barrier

logger = logging.getLogger(__name__)

__all__ = [
    "CheckpointMixin",
    "checkpoints_to_delete",
    "checkpoints_to_delete_at_train_end",
    "get_last_checkpoint",
    "is_complete_checkpoint",
    "training_args_to_plain_dict",
]

# Save strategies for which the reference records `best_global_step` (and so a best checkpoint).
_BEST_TRACKING_SAVE_STRATEGIES = ("steps", "epoch", "best")


def is_pretrained_model(model: Any) -> bool:
    """Duck-typed `PreTrainedModel` (or PEFT model): it saves itself with `save_pretrained` and has a `config`."""
    return callable(getattr(model, "save_pretrained", None)) and hasattr(model, "config")


def unwrap_model(model: Any) -> Any:
    """The user's module inside DDP / DataParallel (`.module`) and `torch.compile` (`._orig_mod`) wrappers."""
    import torch

    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


def _plain(value: Any, field: str) -> Any:
    """`value` as types `torch.load(weights_only=True)` accepts (containers of str / numbers / bool / None)."""
    import torch

    if value is None or isinstance(value, (bool, int, float, str, torch.dtype)):
        return value
    if isinstance(value, enum.Enum):
        return _plain(value.value, field)
    if isinstance(value, dict):
        return {_plain(key, field): _plain(item, field) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(item, field) for item in value)
    if isinstance(value, (set, frozenset)):
        return {_plain(item, field) for item in value}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if callable(getattr(value, "to_dict", None)):
        return _plain(value.to_dict(), field)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value), field)
    warnings.warn(
        f"training_args.bin: field {field!r} holds a {type(value).__name__}, which is not a plain type; it is "
        "stored as its str() so the file stays loadable with torch.load(weights_only=True).",
        stacklevel=3,
    )
    return str(value)


def training_args_to_plain_dict(args: Any) -> dict[str, Any]:
    """`args.to_dict()` as plain types, with every `*_token` field replaced by its `<FIELD_TOKEN>` placeholder.

    The reference's `to_dict` already redacts tokens; redacting again here keeps a secret off disk even when a
    foreign arguments object does not.
    """
    to_dict = getattr(args, "to_dict", None)
    if not callable(to_dict):
        raise TypeError(
            f"Cannot save the training arguments: {type(args).__name__} has no `to_dict()`. Pass a "
            "`TrainingArguments` (hf_lightning's or transformers')."
        )
    plain = {}
    for key, value in to_dict().items():
        plain[key] = f"<{key.upper()}>" if key.endswith("_token") else _plain(value, key)
    return plain


class CheckpointMixin(MetricsIOMixin):
    """Checkpoint writing, best-metric tracking and best-model loading, as the reference's `Trainer` does them.

    The facade provides: `args`, `model`, `state`, `control`, `callback_handler`, `optimizer`, `lr_scheduler`,
    `processing_class`, `data_collator`, `hp_search_backend`, `hp_name`, `store_flos()`, `lightning_trainer`
    (or None) and `is_world_process_zero()`. Methods whose docstring says "all ranks" must be called by every
    process of a distributed run (they hold collectives); the others act on the processes allowed to save.
    """

    # ---- where ----------------------------------------------------------------------------------------------

    def _get_output_dir(self, trial: Any) -> str:
        """The run folder: `output_dir`, or `output_dir/run-<id>` (or `hp_name(trial)`) during a search."""
        backend = enum_value(getattr(self, "hp_search_backend", None))
        if backend is None or trial is None:
            return self.args.output_dir
        if backend == "optuna":
            run_id = trial.number
        elif backend == "ray":
            import ray.tune

            run_id = ray.tune.get_context().get_trial_id()
        elif backend == "wandb":
            import wandb

            run_id = wandb.run.id
        else:
            raise ValueError(
                f"hp_search_backend={backend!r} is not supported; use 'optuna', 'ray' or 'wandb'."
            )
        hp_name = getattr(self, "hp_name", None)
        run_name = hp_name(trial) if hp_name is not None else f"run-{run_id}"
        return os.path.join(self.args.output_dir, run_name)

    # ---- checkpoint ------------------------------------------------------------------------------------------

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Write `checkpoint-<global_step>` atomically, then rotate old checkpoints (CKPT-3.6). All ranks.

        Order as the reference: flos, best checkpoint path, model files, optimizer / scheduler / scaler / RNG,
        trainer state; then (ours) fsync, completion marker, rename into place; then rotation. With Lightning's
        `AsyncCheckpointIO` plugin the files are written, committed and rotated by a background thread
        (`checkpoint/async_writes.py`) once the state is copied off the device.
        """
        writer = background_writer_for(self)
        if writer is not None:
            writer.wait()  # a second save starts once the first is committed (its failure is raised here)
        if getattr(self, "hp_search_backend", None) is None and trial is None:
            self.store_flos()
        run_dir = self._get_output_dir(trial=trial)
        final_dir = os.path.join(run_dir, checkpoint_folder_name(self.state.global_step))
        token = _shared_token()
        temporary_dir = temporary_checkpoint_dir(run_dir, self.state.global_step, token)
        should_save = self.args.should_save
        previous_best = self.state.best_model_checkpoint
        try:
            if should_save:
                shutil.rmtree(temporary_dir, ignore_errors=True)
                os.makedirs(temporary_dir)
            barrier()
            self._update_best_model_checkpoint(run_dir, final_dir)
            if writer is not None:
                writer.submit(self, PendingSave(run_dir, final_dir, temporary_dir, token, previous_best))
                return
            # A process whose filesystem holds no writer's scratch folder (another node's disk, no
            # save_on_each_node) writes its RNG file straight into checkpoint-N there, as the reference does.
            rng_dir = temporary_dir if should_save or os.path.isdir(temporary_dir) else final_dir
            self._write_checkpoint_files(temporary_dir, rng_dir)
            barrier()
            if should_save:
                self._commit_checkpoint_folder(temporary_dir, final_dir, token)
        except BaseException as error:
            self.state.best_model_checkpoint = previous_best
            failure = None
            if should_save and isinstance(error, (OSError, RuntimeError)):
                # torch says "unexpected pos" for a full disk; name output_dir and the system's reason instead.
                failure = write_failure(run_dir, os.path.basename(final_dir), temporary_dir, error)
            if should_save:
                # Every scratch folder of this save goes (an existing folder moved aside comes back).
                clean_scratch_folders(run_dir, token="")
            if failure is not None:
                raise failure from error
            raise
        self._push_checkpoint(final_dir)
        if should_save:
            self._rotate_after_save(run_dir, final_dir, token)

    def _write_checkpoint_files(self, temporary_dir: str, rng_dir: str | None = None) -> None:
        """Every file of one checkpoint into `temporary_dir` (model, optimizer, scheduler, scaler, RNG, state);
        the RNG file into `rng_dir` when given. The disk starts writing them while the rest is serialised."""
        with writeback_while_writing(temporary_dir) as start_writeback:
            self.save_model(temporary_dir, _internal_call=True)
            start_writeback()
            if not self.args.save_only_model:
                self._save_optimizer_and_scheduler(temporary_dir)
                start_writeback()
                self._save_scaler(temporary_dir)
                self._save_rng_state(rng_dir or temporary_dir)
            if self.args.should_save:
                self._save_dataset_position(temporary_dir)
                self._save_trainer_state(temporary_dir)

    def _commit_checkpoint_folder(self, temporary_dir: str, final_dir: str, token: str) -> None:
        """Make the written files durable, write the completion marker, rename the folder into place."""
        reach("fsync")
        # The folder's own entries are made durable once, by the marker's write, before the rename commits.
        fsync_tree(temporary_dir, include_root=False)
        reach("marker")
        write_complete_marker(temporary_dir, self.state.global_step)
        commit_checkpoint(temporary_dir, final_dir, token)

    def _push_checkpoint(self, final_dir: str) -> None:
        """Push the committed checkpoint when `push_to_hub` is set."""
        if self.args.push_to_hub:
            self._push_from_checkpoint(final_dir)  # integrations/hub.py (world process zero only)

    def _rotate_after_save(self, run_dir: str, final_dir: str, token: str) -> None:
        """After a commit: tidy other saves' scratch folders, then delete checkpoints beyond the limit."""
        # Scratch of killed saves first, so a restored aside folder takes part in the rotation.
        clean_scratch_folders(run_dir, token)
        reach("rotate")
        rotate_checkpoints(
            run_dir,
            self.args.save_total_limit,
            self.state.best_model_checkpoint,
            newest=final_dir,
            token=token,
        )

    def _update_best_model_checkpoint(self, run_dir: str, final_dir: str) -> None:
        # The reference sets the path once the best step's folder exists; the folder being written now exists
        # under its final name only after the commit, and trainer_state.json must already name it.
        best_step = self.state.best_global_step
        if enum_value(self.args.save_strategy) not in _BEST_TRACKING_SAVE_STRATEGIES or not best_step:
            return
        best_dir = os.path.join(run_dir, checkpoint_folder_name(best_step))
        if best_dir == final_dir or os.path.exists(best_dir):
            self.state.best_model_checkpoint = best_dir

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """The optimizer and scheduler states, as the strategy holds and names them (`optimizer.pt` and
        `scheduler.pt` for one process or DDP). All ranks: a sharded strategy gathers or writes its shards."""
        self._checkpoint_io.save_optimizer_and_scheduler(self, output_dir, reach)

    def _save_scaler(self, output_dir: str) -> None:
        """`scaler.pt` when Lightning's precision plugin holds an AMP grad scaler (fp16)."""
        import torch

        lightning_trainer = getattr(self, "lightning_trainer", None)
        scaler = getattr(getattr(lightning_trainer, "precision_plugin", None), "scaler", None)
        if scaler is None or not self.args.should_save:
            return
        torch.save(scaler.state_dict(), os.path.join(output_dir, SCALER_NAME))

    def _save_rng_state(self, output_dir: str) -> None:
        """`rng_state.pth` (`rng_state_<rank>.pth` when distributed) with the reference's keys. Every process."""
        import torch

        rng_states = self._rng_states()
        os.makedirs(output_dir, exist_ok=True)
        reach("rng")
        file_name = rng_state_file_name(self.args.world_size, self.args.process_index)
        torch.save(rng_states, os.path.join(output_dir, file_name))

    def _rng_states(self) -> dict[str, Any]:
        """This process's Python, numpy, CPU (and CUDA) generator states, under the reference's keys."""
        import numpy as np
        import torch

        rng_states = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "cpu": torch.random.get_rng_state(),
        }
        if torch.cuda.is_available():
            if enum_value(self.args.parallel_mode) == "distributed":
                rng_states["cuda"] = torch.cuda.random.get_rng_state_all()
            else:
                rng_states["cuda"] = torch.cuda.random.get_rng_state()
        return rng_states

    def _dataset_position_record(self) -> dict[str, Any] | None:
        """The train dataset's recent positions, when its loader records them (data/dataset_position.py)."""
        loader = getattr(getattr(self, "callback_handler", None), "train_dataloader", None)
        positions = getattr(loader, "dataset_positions", None)
        return positions.record() if positions is not None else None

    def _save_dataset_position(self, output_dir: str) -> None:
        """`hf_lightning_dataset_position.json`, so a resume continues the dataset from there (no replay)."""
        record = self._dataset_position_record()
        if record is not None:
            write_position_record(os.path.join(output_dir, DATASET_POSITION_NAME), record)

    def _save_trainer_state(self, output_dir: str) -> None:
        self._refresh_stateful_callbacks()
        reach("trainer_state")
        self.state.save_to_json(os.path.join(output_dir, TRAINER_STATE_NAME))

    def _refresh_stateful_callbacks(self) -> None:
        # Refresh every exportable callback's entry (and TrainerControl's) from its current state. Several
        # instances of one class are stored as a fresh list in callback order; the reference appends to the list
        # it loaded, so it grows at each save and a resume restores the oldest states (docs/divergences.md).

        current: dict[str, Any] = {}
        for callback in self.callback_handler.callbacks + [self.control]:
            if not is_exportable_state(callback):
                continue
            name = callback.__class__.__name__
            if name in current:
                if not isinstance(current[name], list):
                    current[name] = [current[name]]
                current[name].append(callback.state())
            else:
                current[name] = callback.state()
        self.state.stateful_callbacks = {**(self.state.stateful_callbacks or {}), **current}

    # ---- best metric and best model --------------------------------------------------------------------------

    def _determine_best_metric(self, metrics: dict[str, float], trial: Any) -> bool:
        """Update `best_metric` (and `best_global_step`) from an evaluation; True when it improved (CKPT-3.7)."""
        import numpy as np

        if self.args.metric_for_best_model is None:
            return False
        metric_to_check = self.args.metric_for_best_model
        if not metric_to_check.startswith("eval_"):
            metric_to_check = f"eval_{metric_to_check}"
        try:
            metric_value = metrics[metric_to_check]
        except KeyError as exc:
            raise KeyError(
                f"The `metric_for_best_model` training argument is set to '{metric_to_check}', which is not found in "
                f"the evaluation metrics. The available evaluation metrics are: {list(metrics.keys())}. Consider "
                "changing the `metric_for_best_model` via the TrainingArguments."
            ) from exc
        operator = np.greater if self.args.greater_is_better else np.less
        if self.state.best_metric is None:
            self.state.best_metric = float("-inf") if self.args.greater_is_better else float("inf")
        if not operator(metric_value, self.state.best_metric):
            return False
        self.state.best_metric = metric_value
        if enum_value(self.args.save_strategy) in _BEST_TRACKING_SAVE_STRATEGIES:
            self.state.best_global_step = self.state.global_step
        return True

    def _load_best_model(self) -> None:
        """Load the weights of `state.best_model_checkpoint` into the model (non-strict, as the reference), as the
        strategy holds it. Files are read without running pickled code; missing weights only warn. All ranks."""
        best_dir = self.state.best_model_checkpoint
        logger.info(f"Loading best model from {best_dir} (score: {self.state.best_metric}).")
        self._checkpoint_io.load_best_weights(self, best_dir)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        """Load the model weights of the checkpoint folder `resume_from_checkpoint` (non-strict, as the reference).

        The reference's override point: a resume calls it before training, or, where the strategy loads into the
        wrapped model (FSDP), with that model once it is built; a subclass may load its own layout.
        """
        logger.info(f"Loading model from {resume_from_checkpoint}.")
        warn_on_version_mismatch(resume_from_checkpoint)
        self._checkpoint_io.load_weights(self, resume_from_checkpoint, self.model if model is None else model)

    @property
    def _checkpoint_io(self) -> StrategyCheckpointIO:
        """How the planned strategy writes and reads the model and optimizer files (strategies/checkpoint_io.py)."""
        return checkpoint_io_for(self.plan)

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """Warn about missing / unexpected keys; re-tie weights when only the keys ignored at save are missing."""
        if len(load_result.missing_keys) != 0:
            ignored_on_save = getattr(self.model, "_keys_to_ignore_on_save", None)
            if ignored_on_save and set(load_result.missing_keys) == set(ignored_on_save):
                self.model.tie_weights()
            else:
                logger.warning(
                    f"There were missing keys in the checkpoint model loaded: {load_result.missing_keys}."
                )
        if len(load_result.unexpected_keys) != 0:
            logger.warning(
                f"There were unexpected keys in the checkpoint model loaded: {load_result.unexpected_keys}."
            )

    def _after_training_rotation(self, trial: Any = None) -> None:
        """End of training: with `save_total_limit == 1` and a best checkpoint, delete every other checkpoint."""
        if not self.args.should_save or self.state.best_model_checkpoint is None:
            return
        run_dir = self._get_output_dir(trial if trial is not None else getattr(self, "_trial", None))
        checkpoints = list_checkpoints(run_dir)
        doomed = checkpoints_to_delete_at_train_end(
            checkpoints, self.args.save_total_limit, self.state.best_model_checkpoint
        )
        if self.args.save_total_limit == 1 and len(checkpoints) > 1 and not doomed:
            # Only when the best folder is gone; the reference raises FileNotFoundError here.
            logger.warning(
                f"save_total_limit=1: the best checkpoint {self.state.best_model_checkpoint} is not in {run_dir}; "
                "no checkpoint was deleted at the end of training."
            )
        for path in doomed:
            logger.info(f"Deleting older checkpoint [{path}] due to args.save_total_limit")
            # Only the processes allowed to save get here, so no collective: the token is this process's pid.
            delete_checkpoint(path, str(os.getpid()))

    # ---- model files -----------------------------------------------------------------------------------------

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model (and processing class, training args) so `from_pretrained()` can reload it."""
        if output_dir is None:
            output_dir = self.args.output_dir
        self._checkpoint_io.save_model(self, output_dir)  # all ranks: a sharded strategy gathers
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Weights (`save_pretrained` or a flat safetensors file), processing class files, `training_args.bin`."""
        import torch

        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return
        os.makedirs(output_dir, exist_ok=True)
        logger.info(f"Saving model checkpoint to {output_dir}")
        reach("model")
        with deepspeed_probe_skipped_while_unloaded():
            self._save_weights(output_dir, state_dict)
        apply_umask(output_dir)
        processing_class = self.processing_class
        if processing_class is None:
            tokenizer = getattr(self.data_collator, "tokenizer", None)
            if tokenizer is not None:
                logger.info(
                    "Saving Trainer.data_collator.tokenizer by default as Trainer.processing_class is `None`"
                )
            processing_class = tokenizer
        if processing_class is not None:
            reach("processing_class")
            processing_class.save_pretrained(output_dir)
        reach("training_args")
        torch.save(training_args_to_plain_dict(self.args), os.path.join(output_dir, TRAINING_ARGS_NAME))

    def _save_weights(self, output_dir: str, state_dict: dict | None) -> None:
        """The weights alone: the model's `save_pretrained` (unwrapped first) or a flat safetensors file."""
        import safetensors.torch

        if is_pretrained_model(self.model):
            self.model.save_pretrained(
                output_dir, state_dict=state_dict, is_main_process=self.args.should_save
            )
            return
        if state_dict is None:
            state_dict = self.model.state_dict()
        unwrapped = unwrap_model(self.model)
        if is_pretrained_model(unwrapped):
            unwrapped.save_pretrained(output_dir, state_dict=state_dict, is_main_process=self.args.should_save)
        else:
            logger.info("Trainer.model is not a `PreTrainedModel`, only saving its state dict.")
            safetensors.torch.save_file(
                state_dict, os.path.join(output_dir, SAFE_WEIGHTS_NAME), metadata={"format": "pt"}
            )

    def save_state(self) -> None:
        """Write `output_dir/trainer_state.json` (world process zero only), replacing any previous file at once."""
        if not self.is_world_process_zero():
            return
        path = os.path.join(self.args.output_dir, TRAINER_STATE_NAME)
        temporary = f"{path}.tmp-{os.getpid()}"
        self.state.save_to_json(temporary)
        os.replace(temporary, path)


def _shared_token() -> str:
    """A name part for this save's scratch folders that every rank agrees on: the pid of rank 0."""
    import torch.distributed as dist

    token = [str(os.getpid())]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(token, src=0)
    return token[0]
