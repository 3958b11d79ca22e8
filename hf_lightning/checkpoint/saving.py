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
import warnings
from typing import Any

from hf_lightning.callbacks import is_exportable_state
from hf_lightning.checkpoint.checkpointer import BEST_TRACKING_SAVE_STRATEGIES, Checkpointer
from hf_lightning.checkpoint.fault_points import reach
from hf_lightning.checkpoint.files import (
    checkpoints_to_delete,
    checkpoints_to_delete_at_train_end,
    get_last_checkpoint,
    is_complete_checkpoint,
)
from hf_lightning.checkpoint.metrics_files import MetricsIOMixin
from hf_lightning.checkpoint.output_folder import apply_umask
from hf_lightning.checkpoint.resume import (
    load_callback_state,
    load_rng_state,
    load_scaler_state,
    resume_files,
    warn_on_version_mismatch,
)
from hf_lightning.checkpoint.save_imports import deepspeed_probe_skipped_while_unloaded
from hf_lightning.core.checkpoint_files import (
    SAFE_WEIGHTS_NAME,
    SCALER_NAME,
    TRAINER_STATE_NAME,
    TRAINING_ARGS_NAME,
    rng_state_file_name,
)
from hf_lightning.core.enums import enum_value
from hf_lightning.data.position_files import SKIPPED_WINDOWS_KEY
from hf_lightning.strategies.build import checkpoint_io_for
from hf_lightning.strategies.checkpoint_io import StrategyCheckpointIO

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
    The facade builds its `Checkpointer` (the save protocol, its background writer, the end-of-training rotation)
    in its constructor.
    """

    _checkpointer: Checkpointer

    # ---- where ----------------------------------------------------------------------------------------------

    def _get_output_dir(self, trial: Any) -> str:
        """The run folder: `output_dir`, or `output_dir/run-<id>` (or `hp_name(trial)`) during a search."""
        backend = enum_value(self.hp_search_backend)
        if backend is None or trial is None:
            return self.args.output_dir
        if backend == "optuna":
            run_id = trial.number
        elif backend == "ray":
            import ray.tune

            # A worker of a multi-worker trial has no Tune context; its driver handed it the trial id.
            run_id = getattr(self, "_ray_worker_trial_id", None) or ray.tune.get_context().get_trial_id()
        elif backend == "wandb":
            import wandb

            run_id = wandb.run.id
        else:
            raise ValueError(
                f"hp_search_backend={backend!r} is not supported; use 'optuna', 'ray' or 'wandb'."
            )
        run_name = self.hp_name(trial) if self.hp_name is not None else f"run-{run_id}"
        return os.path.join(self.args.output_dir, run_name)

    # ---- checkpoint ------------------------------------------------------------------------------------------

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Write `checkpoint-<global_step>` atomically, then rotate old checkpoints (CKPT-3.6). All ranks.

        The reference's override point; the protocol is the trainer's `Checkpointer` (checkpoint/checkpointer.py),
        which calls back `save_model`, `_save_optimizer_and_scheduler`, `_save_scaler` and `_save_rng_state`.
        """
        self._checkpointer.save(trial)

    def _push_checkpoint(self, final_dir: str) -> None:
        """Push the committed checkpoint when `push_to_hub` is set."""
        if self.plan.hub.push_to_hub:
            self._push_from_checkpoint(final_dir)  # integrations/hub.py (world process zero only)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """The optimizer and scheduler states, as the strategy holds and names them (`optimizer.pt` and
        `scheduler.pt` for one process or DDP). All ranks: a sharded strategy gathers or writes its shards."""
        self._checkpoint_io.save_optimizer_and_scheduler(self, output_dir, reach)

    def _save_scaler(self, output_dir: str) -> None:
        """`scaler.pt` when Lightning's precision plugin holds an AMP grad scaler (fp16)."""
        import torch

        lightning_trainer = self.lightning_trainer
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

    def _data_position_record(self) -> Any:
        """Where the train data stands at this step (data/position_files.py's `DataPositionRecord`), when the train
        loader records it (an HFDataLoader built by the trainer) and a run is training; else None."""
        loader = getattr(self.callback_handler, "train_dataloader", None)
        record = getattr(loader, "position_record", None)
        run = self._training_run
        module = getattr(run, "module", None)
        if record is None or module is None:
            return None
        skipped = getattr(run, "skipped_windows", None)
        position = record(
            global_step=self.state.global_step,
            epoch=module.current_epoch,
            batch=module.batches_trained_in_epoch,
            always=bool(skipped),
        )
        if skipped and position is not None:  # windows a run guard took out of the path: a resume places the data past them too
            position = dataclasses.replace(position, position={**position.position, SKIPPED_WINDOWS_KEY: skipped.as_json()})
        return position

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

        if self.plan.checkpointing.metric_for_best_model is None:
            return False
        metric_to_check = self.plan.checkpointing.metric_for_best_model
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
        operator = np.greater if self.plan.checkpointing.greater_is_better else np.less
        if self.state.best_metric is None:
            self.state.best_metric = float("-inf") if self.plan.checkpointing.greater_is_better else float("inf")
        if not operator(metric_value, self.state.best_metric):
            return False
        self.state.best_metric = metric_value
        if enum_value(self.plan.checkpointing.save_strategy) in BEST_TRACKING_SAVE_STRATEGIES:
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

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """The optimizer and scheduler states of `checkpoint` (both or neither), as the strategy holds them. The
        reference's override point: a resume calls it once Lightning has built the optimizer and scheduler."""
        if checkpoint is not None:
            self._checkpoint_io.load_optimizer_and_scheduler(self, resume_files(self, checkpoint))

    def _load_scaler(self, checkpoint: str | None) -> None:
        """The fp16 grad scaler's state of `checkpoint`, right after the optimizer's (the reference's override point)."""
        if checkpoint is not None:
            load_scaler_state(self, checkpoint)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        """The random generators' states of `checkpoint` (this process's RNG file), where the resumed epoch draws
        as the uninterrupted run did (the reference's override point and moment)."""
        if checkpoint is not None:
            load_rng_state(self, checkpoint)

    def _load_callback_state(self) -> None:
        """`restore_callback_states_from_checkpoint`: the callbacks (and `control`) the resumed trainer state
        stores, rebuilt (the reference's override point)."""
        load_callback_state(self)

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

    # ---- model files -----------------------------------------------------------------------------------------

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model (and processing class, training args) so `from_pretrained()` can reload it."""
        if output_dir is None:
            output_dir = self.args.output_dir
        # All ranks: a sharded strategy gathers (or, in a checkpoint, keeps its shards).
        self._checkpoint_io.save_model(self, output_dir, in_checkpoint=_internal_call)
        if self.plan.hub.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.plan.hub.revision)

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
