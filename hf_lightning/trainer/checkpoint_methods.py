"""Saving side of checkpoints for the trainer facade: `_save_checkpoint`, `save_model`, best-model tracking.

Writes the reference's layout (CKPT-3.2) atomically: everything goes into a hidden temporary
sibling folder, which gets a completion marker last and is then renamed to `checkpoint-<step>`; old checkpoints
are rotated out only after that. `training_args.bin` holds a plain, token-free dict, loadable with
`torch.load(weights_only=True)` (the reference pickles its `TrainingArguments`, token included).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from types import MappingProxyType
from typing import Any

from hf_lightning.callbacks import is_exportable_state
from hf_lightning.checkpoint.checkpointer import BEST_TRACKING_SAVE_STRATEGIES, Checkpointer
from hf_lightning.checkpoint.fault_points import reach
from hf_lightning.checkpoint.resume import load_callback_state
from hf_lightning.checkpoint.resume_files import (
    load_rng_state,
    load_scaler_state,
    resume_files,
    warn_on_version_mismatch,
)
from hf_lightning.checkpoint.staging import (
    rng_states,
    training_args_to_plain_dict,
    write_model_folder,
    write_rng_state,
    write_scaler,
)
from hf_lightning.core.checkpoint_files import TRAINER_STATE_NAME
from hf_lightning.core.enums import enum_value
from hf_lightning.data.position_files import SKIPPED_WINDOWS_KEY
from hf_lightning.strategies.build import checkpoint_io_for
from hf_lightning.strategies.checkpoint_io import StrategyCheckpointIO
from hf_lightning.trainer.metrics_methods import MetricsIOMixin

logger = logging.getLogger(__name__)

__all__ = ["CheckpointMixin"]


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
            run_id = self._ray_worker_trial_id or ray.tune.get_context().get_trial_id()
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
        which writes a staged checkpoint, or calls back `save_model`, `_save_optimizer_and_scheduler`, `_save_scaler`
        and `_save_rng_state` where a subclass overrides one (on the training thread).
        """
        self._checkpointer.save(trial)

    def _push_checkpoint(self, final_dir: str) -> None:
        """Push the committed checkpoint when `push_to_hub` is set."""
        if self.plan.hub.push_to_hub:
            self._push_from_checkpoint(final_dir)  # trainer/hub_methods.py (world process zero only)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """The optimizer and scheduler states, as the strategy holds and names them (`optimizer.pt` and
        `scheduler.pt` for one process or DDP). All ranks: a sharded strategy gathers or writes its shards."""
        self._checkpoint_io.save_optimizer_and_scheduler(self, output_dir, reach)

    def _save_scaler(self, output_dir: str) -> None:
        """`scaler.pt` when Lightning's precision plugin holds an AMP grad scaler (fp16)."""
        scaler = getattr(getattr(self.lightning_trainer, "precision_plugin", None), "scaler", None)
        if scaler is None or not self.args.should_save:
            return
        write_scaler(output_dir, scaler.state_dict())

    def _save_rng_state(self, output_dir: str) -> None:
        """`rng_state.pth` (`rng_state_<rank>.pth` when distributed) with the reference's keys. Every process."""
        write_rng_state(output_dir, rng_states(self.args), self.args.world_size, self.args.process_index)

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
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return
        write_model_folder(
            output_dir, self.model, state_dict, self.processing_class, self.data_collator,
            training_args_to_plain_dict(self.args),
        )  # fmt: skip

    # The base save hooks: the `Checkpointer` tells a subclass's override (or a patch) from them at each save.
    _base_save_hooks = MappingProxyType(
        {
            "_save_checkpoint": _save_checkpoint,
            "save_model": save_model,
            "_save": _save,
            "_save_optimizer_and_scheduler": _save_optimizer_and_scheduler,
            "_save_scaler": _save_scaler,
            "_save_rng_state": _save_rng_state,
        }
    )

    def save_state(self) -> None:
        """Write `output_dir/trainer_state.json` (world process zero only), replacing any previous file at once."""
        if not self.is_world_process_zero():
            return
        path = os.path.join(self.args.output_dir, TRAINER_STATE_NAME)
        temporary = f"{path}.tmp-{os.getpid()}"
        self.state.save_to_json(temporary)
        os.replace(temporary, path)
