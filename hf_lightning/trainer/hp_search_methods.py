"""The facade's `hyperparameter_search` and the per-trial hooks `train()` and `evaluate()` call (HPO-5).

Each trial re-creates the model through `model_init`, applies the trial's parameters to `trainer.args`, trains
(checkpoints go to `output_dir/run-<trial id>`), reports every training-time evaluation to the backend so a pruner
or scheduler can stop it, and returns the objective. The backends, their runners and the default spaces are in
integrations/hp_search.py and integrations/ray_tune.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hf_lightning.args.changes import arguments_snapshot
from hf_lightning.args.deepspeed_config import deepspeed_fill_at_construction, load_deepspeed_config
from hf_lightning.core.enums import enum_value
from hf_lightning.core.outputs import BestRun
from hf_lightning.integrations.hp_search import (
    HPSearchBackend,
    default_compute_objective,
    default_hp_space_optuna,
    import_optuna,
    resolve_backend,
    run_hp_search_optuna,
)
from hf_lightning.integrations.ray_tune import default_hp_space_ray, report_trial_to_ray, run_hp_search_ray
from hf_lightning.translation.translate import translate

if TYPE_CHECKING:
    import optuna

__all__ = ["HyperparameterSearchMixin"]

logger = logging.getLogger(__name__)


class HyperparameterSearchMixin:
    """`hyperparameter_search` and the per-trial hooks `train()` and `evaluate()` call (a mixin of the facade).

    The facade provides: `args`, `model`, `model_wrapped`, `model_init`, `state`, `control`, `callback_handler`,
    `hp_name`, `hp_search_backend`, `_train_batch_size`, `lightning_trainer`, `is_deepspeed_enabled`, `train()`,
    `evaluate()` and `_fire(event)`.
    """

    # The Tune trial a Ray Train worker's copy of the trainer runs for (integrations/ray_tune_workers.py sets it on
    # that copy; Tune's context lives in the trial's driver only). None everywhere else.
    _ray_worker_trial_id: str | None = None

    def hyperparameter_search(
        self,
        hp_space: Callable[[optuna.Trial], dict[str, float]] | None = None,
        compute_objective: Callable[[dict[str, float]], float] | None = None,
        n_trials: int = 20,
        direction: str | list[str] = "minimize",
        backend: str | HPSearchBackend | None = None,
        hp_name: Callable[[optuna.Trial], str] | None = None,
        **kwargs: Any,
    ) -> BestRun | list[BestRun]:
        """Search hyperparameters with optuna or Ray Tune: one `train()` per trial, a fresh model from `model_init`.

        `direction` as a list makes a multi-objective search and returns the Pareto front as a list of `BestRun`.
        optuna: `timeout`, `n_jobs`, `gc_after_trial` and `catch` in `kwargs` go to `study.optimize`; the others to
        `optuna.create_study` (`sampler`, `pruner`, `storage`, `study_name`, `load_if_exists`, ...), so a
        study in a `storage` can be resumed after a crash. ray: `resources_per_trial`, then the keywords of
        `ray.tune.TuneConfig` and `ray.tune.RunConfig` (`scheduler`, `search_alg`, `storage_path`, `name`, ...);
        `scaling_config=ray.train.ScalingConfig(num_workers=N)` trains each trial on N Ray Train workers;
        `resume=True` (`tune.run`'s keyword) restores the interrupted search at `storage_path/name` when there is one.
        """
        backend = resolve_backend(backend)
        if backend != HPSearchBackend.RAY and "scaling_config" in kwargs:
            raise ValueError(
                f"hyperparameter_search(backend={backend.value!r}, scaling_config=...): trials on several Ray Train "
                "workers need backend='ray'; optuna runs each trial in the processes already started (launch the "
                "script with torchrun for several processes)."
            )
        if self.model_init is None:
            raise RuntimeError(
                "To use hyperparameter search, you need to pass your model through a model_init function."
            )
        self.hp_search_backend = backend
        default_space = default_hp_space_ray if backend == HPSearchBackend.RAY else default_hp_space_optuna
        self.hp_space = default_space if hp_space is None else hp_space
        self.hp_name = hp_name
        self.compute_objective = default_compute_objective if compute_objective is None else compute_objective
        try:
            if backend == HPSearchBackend.RAY:
                return run_hp_search_ray(self, n_trials, direction, **kwargs)
            return run_hp_search_optuna(self, n_trials, direction, **kwargs)
        finally:
            # Also after a failed trial (the reference leaves the backend set then): later train() calls are plain.
            self.hp_search_backend = None

    def _hp_search_setup(self, trial: Any) -> None:
        """Apply the trial's parameters to `args` (cast to the current value's type), then redo derived set-up."""
        self._trial = trial
        if self.hp_search_backend is None or trial is None:
            return
        ray = enum_value(self.hp_search_backend) == HPSearchBackend.RAY.value
        if ray:
            params = trial  # Ray Tune's sampled config
            params.pop("wandb", None)
        else:
            params = self.hp_space(trial)
        for key, value in params.items():
            if not hasattr(self.args, key):
                logger.warning(
                    f"Trying to set {key} in the hyperparameter search but there is no corresponding field in"
                    " `TrainingArguments`."
                )
                continue
            old_attr = getattr(self.args, key, None)
            # Casting value to the proper type
            if old_attr is not None:
                value = type(old_attr)(value)
            setattr(self.args, key, value)
        if not ray:
            logger.info(f"Trial: {trial.params}")
        self._refresh_deepspeed_config()
        # `train_batch_size` may be one of the searched parameters.
        self._train_batch_size = self.args.train_batch_size
        self.create_accelerator_and_postprocess()

    def create_accelerator_and_postprocess(self) -> None:
        """Rebuild the Lightning plan from `args` (the reference rebuilds its accelerator here, per trial): every
        field, those it otherwise reads only in its constructor included, is read from here on."""
        self.plan = translate(self.args)
        self._planned_arguments = arguments_snapshot(self.args)

    def _refresh_deepspeed_config(self) -> None:
        """Refill the DeepSpeed config's "auto" values from the trial's arguments, as the reference does."""
        if self.is_deepspeed_enabled and self.args.deepspeed is None:
            raise ValueError("For sweeps with deepspeed, `args.deepspeed` must be set")
        if not self.args.deepspeed:
            return
        config = load_deepspeed_config(self.args.deepspeed)
        self.args.deepspeed_mismatches = deepspeed_fill_at_construction(config, self.args)
        self.args.hf_deepspeed_config = config

    def _report_to_hp_search(self, trial: Any, step: int, metrics: dict[str, float]) -> None:
        """After a training-time evaluation: store the objective, report it to the backend.

        optuna: only single-objective studies report; a pruned trial fires `on_train_end`, then raises
        `TrialPruned` (before this step's checkpoint is written). ray: `tune.report` with the objective, and a
        trial checkpoint from `_tune_save_checkpoint` when this step saves.
        """
        if self.hp_search_backend is None or trial is None:
            return
        metrics = metrics.copy()
        self.objective = self.compute_objective(metrics)
        if enum_value(self.hp_search_backend) == HPSearchBackend.RAY.value:
            report_trial_to_ray(self, metrics)
            return
        study = getattr(trial, "study", None)  # a FixedTrial (other DDP ranks) has none
        if study is not None and len(study.directions) == 1:
            trial.report(self.objective, step)
            if trial.should_prune():
                self.callback_handler.on_train_end(self.args, self.state, self.control)
                raise import_optuna().TrialPruned()


    def _tune_save_checkpoint(self, checkpoint_dir: str) -> None:
        """A Ray Tune trial's checkpoint: a complete `checkpoint-<global_step>` folder inside `checkpoint_dir` (the
        files, marker and data position of an ordinary save, so a resumed trial continues exactly)."""
        self._checkpointer.save_copy(checkpoint_dir)
