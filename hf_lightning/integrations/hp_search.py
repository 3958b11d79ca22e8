"""The backends of the facade's `hyperparameter_search` (trainer/hp_search_methods.py, HPO-5): their names and
choice, the reference's default objective and optuna space, and the optuna runner.

optuna and Ray are imported lazily (the `optuna` and `ray` extras); the Ray Tune runner is integrations/ray_tune.py.
W&B sweeps are refused with a ValueError.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Protocol

import torch

import hf_lightning.strategies.distributed as distributed
from hf_lightning.core.devices import empty_device_cache
from hf_lightning.core.enums import ExplicitEnum, ParallelMode, enum_value
from hf_lightning.core.outputs import BestRun
from hf_lightning.integrations.ray_tune import (
    MissingBackendError,
    SearchedTrainer,
    default_hp_space_ray,
    import_ray_tune,
    run_hp_search_ray,
)

if TYPE_CHECKING:
    import optuna

    from hf_lightning.integrations.ray_tune_workers import TrialTrainer

__all__ = [
    "BestRun",
    "HPSearchBackend",
    "default_compute_objective",
    "default_hp_space_optuna",
    "default_hp_space_ray",
    "run_hp_search_optuna",
    "run_hp_search_ray",
]

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


class OptunaTrainer(SearchedTrainer, Protocol):
    """The trainer an optuna search runs its trials on: a Ray trial's members, and the Lightning trainer each trial
    drops with its model."""

    lightning_trainer: Any  # lightning.pytorch.Trainer of the last trial, None between trials


def _run_trial(trainer: TrialTrainer, trial: Any) -> Any:
    """Train one trial and return its objective (a final `evaluate()` when training never evaluated)."""
    trainer.objective = None
    trainer.train(resume_from_checkpoint=None, trial=trial)
    if trainer.objective is None:
        metrics = trainer.evaluate()
        trainer.objective = trainer.compute_objective(metrics)
    return trainer.objective


def _release_trial_memory(trainer: OptunaTrainer) -> None:
    """Drop the trial's model and Lightning trainer (the reference's `release_memory` + `accelerator.clear()`)."""
    trainer.model_wrapped, trainer.model = None, None
    trainer.lightning_trainer = None
    empty_device_cache(collect_garbage=True)


def _check_distributed(trainer: TrialTrainer) -> None:
    if trainer.args.parallel_mode != ParallelMode.DISTRIBUTED:
        raise RuntimeError("only support DDP optuna HPO for ParallelMode.DISTRIBUTED currently.")


def run_hp_search_optuna(
    trainer: OptunaTrainer, n_trials: int, direction: str | list[str], **kwargs: Any
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
