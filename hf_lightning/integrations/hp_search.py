"""Hyperparameter search with optuna or Ray Tune, as the reference's `Trainer.hyperparameter_search` (HPO-5).

Each trial re-creates the model through `model_init`, applies the trial's parameters to `trainer.args`, trains
(checkpoints go to `output_dir/run-<trial id>`), reports every training-time evaluation to the backend so a pruner
or scheduler can stop it, and returns the objective. optuna and Ray are imported lazily (the `optuna` and `ray`
extras); the Ray Tune runner is integrations/ray_tune.py. W&B sweeps are refused with a ValueError.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

import hf_lightning.strategies.distributed as distributed
from hf_lightning.args.changes import arguments_snapshot
from hf_lightning.args.deepspeed_config import deepspeed_fill_at_construction, load_deepspeed_config
from hf_lightning.core.devices import empty_device_cache
from hf_lightning.core.enums import ExplicitEnum, ParallelMode, enum_value
from hf_lightning.core.outputs import BestRun
from hf_lightning.integrations.ray_tune import (
    MissingBackendError,
    default_hp_space_ray,
    import_ray_tune,
    report_trial_to_ray,
    run_hp_search_ray,
)
from hf_lightning.translation.translate import translate

if TYPE_CHECKING:
    import optuna

__all__ = [
    "BestRun",
    "HPSearchBackend",
    "HyperparameterSearchMixin",
    "default_compute_objective",
    "default_hp_space_optuna",
    "default_hp_space_ray",
    "run_hp_search_optuna",
    "run_hp_search_ray",
]

logger = logging.getLogger(__name__)

# `timeout`, `n_jobs`, `gc_after_trial` and `catch` go to `study.optimize`; every other kwarg goes to `create_study`.
_OPTIMIZE_KWARGS = {"timeout": None, "n_jobs": 1, "gc_after_trial": False, "catch": ()}


class HPSearchBackend(ExplicitEnum):
    """The reference's backend names; `optuna` and `ray` are supported by hf_lightning."""

    OPTUNA = "optuna"
    RAY = "ray"
    WANDB = "wandb"


def import_optuna():
    """Import optuna, or raise `MissingBackendError` naming the extra that installs it."""
    try:
        import optuna
    except ImportError as error:
        raise MissingBackendError(
            "hyperparameter_search needs optuna, which is not installed: run `pip install -e \".[optuna]\"` "
            "from a checkout (or `pip install optuna`)."
        ) from error
    return optuna


def default_compute_objective(metrics: dict[str, float]) -> float:
    """The reference's default objective: `eval_loss` when no other metric is left, else the sum of the metrics.

    `epoch` and the speed metrics (`*_runtime`, `*_per_second`) are left out; memory metrics are not.
    """
    metrics = copy.deepcopy(metrics)
    loss = metrics.pop("eval_loss", None)
    metrics.pop("epoch", None)
    for name in [m for m in metrics if m.endswith("_runtime") or m.endswith("_per_second")]:
        metrics.pop(name, None)
    return loss if len(metrics) == 0 else sum(metrics.values())


def default_hp_space_optuna(trial: optuna.Trial) -> dict[str, float]:
    """The reference's default optuna search space: learning rate, epochs, seed and train batch size."""
    import_optuna()
    return {
        "learning_rate": trial.suggest_float("learning_rate", 1e-6, 1e-4, log=True),
        "num_train_epochs": trial.suggest_int("num_train_epochs", 1, 5),
        "seed": trial.suggest_int("seed", 1, 40),
        "per_device_train_batch_size": trial.suggest_categorical(
            "per_device_train_batch_size", [4, 8, 16, 32, 64]
        ),
    }


def _installed(module: str) -> bool:
    import importlib.util  # lazy: only a search without a backend name asks

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def resolve_backend(backend: str | HPSearchBackend | None) -> HPSearchBackend:
    """`optuna` or `ray` (installed, else `MissingBackendError`); `None` -> optuna when installed, else Ray Tune
    when installed (the reference's order); any other name -> ValueError."""
    name = enum_value(backend)
    if name is None:
        if not _installed("optuna") and _installed("ray.tune"):
            name = HPSearchBackend.RAY.value
        elif not _installed("optuna"):
            raise MissingBackendError(
                "hyperparameter_search needs a backend and none is installed: run `pip install -e \".[optuna]\"` "
                "or `pip install -e \".[ray]\"` from a checkout (or `pip install optuna` / `pip install 'ray[tune]'`)."
            )
        else:
            name = HPSearchBackend.OPTUNA.value
    if name == HPSearchBackend.OPTUNA.value:
        import_optuna()
        return HPSearchBackend.OPTUNA
    if name == HPSearchBackend.RAY.value:
        import_ray_tune()
        return HPSearchBackend.RAY
    known = [b.value for b in HPSearchBackend]
    kind = (
        "is not supported by hf_lightning"
        if name in known
        else f"is not a backend (the reference knows {known})"
    )
    raise ValueError(
        f"hyperparameter_search(backend={name!r}): {name!r} {kind}; the 'optuna' and 'ray' backends are supported. "
        "Pass backend='optuna' or backend='ray' (or leave it None) and install it with `pip install -e \".[optuna]\"` "
        "or `pip install -e \".[ray]\"` from a checkout."
    )


class HyperparameterSearchMixin:
    """`hyperparameter_search` and the per-trial hooks `train()` and `evaluate()` call (a mixin of the facade).

    The facade provides: `args`, `model`, `model_wrapped`, `model_init`, `state`, `control`, `callback_handler`,
    `hp_name`, `hp_search_backend`, `_train_batch_size`, `lightning_trainer`, `is_deepspeed_enabled`, `train()`,
    `evaluate()` and `_fire(event)`.
    """

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


def _run_trial(trainer: Any, trial: Any) -> Any:
    """Train one trial and return its objective (a final `evaluate()` when training never evaluated)."""
    trainer.objective = None
    trainer.train(resume_from_checkpoint=None, trial=trial)
    if getattr(trainer, "objective", None) is None:
        metrics = trainer.evaluate()
        trainer.objective = trainer.compute_objective(metrics)
    return trainer.objective


def _release_trial_memory(trainer: Any) -> None:
    """Drop the trial's model and Lightning trainer (the reference's `release_memory` + `accelerator.clear()`)."""
    trainer.model_wrapped, trainer.model = None, None
    trainer.lightning_trainer = None
    empty_device_cache(collect_garbage=True)


def _check_distributed(trainer: Any) -> None:
    if trainer.args.parallel_mode != ParallelMode.DISTRIBUTED:
        raise RuntimeError("only support DDP optuna HPO for ParallelMode.DISTRIBUTED currently.")


def run_hp_search_optuna(
    trainer: Any, n_trials: int, direction: str | list[str], **kwargs: Any
) -> BestRun | list[BestRun] | None:
    """The reference's optuna runner. Under DDP, rank 0 samples and broadcasts each trial; the others return None."""
    optuna = import_optuna()

    if trainer.args.world_size > 1:
        distributed.ensure_process_group(trainer.args)
    if trainer.args.process_index != 0:
        for _ in range(n_trials):
            trainer.objective = None
            _check_distributed(trainer)
            trial_main_rank_list = [None]
            torch.distributed.broadcast_object_list(trial_main_rank_list, src=0)
            _run_trial(trainer, trial_main_rank_list[0])
        return None

    def _objective(trial: optuna.Trial) -> Any:
        if trainer.args.world_size > 1:
            _check_distributed(trainer)
            trainer.hp_space(trial)
            fixed_trial = optuna.trial.FixedTrial(trial.params, trial.number)
            torch.distributed.broadcast_object_list([fixed_trial], src=0)
        objective = _run_trial(trainer, trial)
        _release_trial_memory(trainer)
        return objective

    optimize_kwargs = {name: kwargs.pop(name, default) for name, default in _OPTIMIZE_KWARGS.items()}
    directions = direction if isinstance(direction, list) else None
    direction = None if directions is not None else direction
    study = optuna.create_study(direction=direction, directions=directions, **kwargs)
    study.optimize(_objective, n_trials=n_trials, **optimize_kwargs)
    if len(study.directions) == 1:
        best_trial = study.best_trial
        return BestRun(str(best_trial.number), best_trial.value, best_trial.params)
    return [BestRun(str(best.number), best.values, best.params) for best in study.best_trials]
