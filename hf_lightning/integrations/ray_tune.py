"""Hyperparameter search with Ray Tune, as the reference's `run_hp_search_ray`, on Ray's current API.

The reference hands its keywords to `ray.tune.run`; here the same keywords are sorted into `ray.tune.Tuner`'s
`TuneConfig` / `RunConfig` (a name neither knows is refused before any trial starts), each trial is a function
trainable over a copy of the trainer (`tune.with_parameters`, `tune.with_resources`), reports every evaluation with
`tune.report` (a checkpoint from `_tune_save_checkpoint` when the step saves), and resumes from
`tune.get_checkpoint()`. The best run is chosen with `RAY_SCOPE` (the v4 field `ray_scope`) and carries Ray's
`ExperimentAnalysis` as `run_summary`. `resume=` (the reference's `tune.run` keyword) restores an interrupted search
with `Tuner.restore` (integrations/ray_tune_restore.py). Ray is imported lazily (the `ray` extra).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from hf_lightning.core.checkpoint_files import PREFIX_CHECKPOINT_DIR
from hf_lightning.core.enums import enum_value
from hf_lightning.core.outputs import BestRun
from hf_lightning.integrations.ray_tune_restore import search_to_restore
from hf_lightning.integrations.ray_tune_workers import (
    DRIVER_RESOURCES,
    TrialTrainer,
    objective_metrics,
    report_from_worker,
    scaling_config_problem,
    trial_on_workers,
    worker_trial_id,
)

logger = logging.getLogger(__name__)

__all__ = ["default_hp_space_ray", "import_ray_tune", "report_trial_to_ray", "run_hp_search_ray"]

# The reference's `tune.run` keywords that became part of another config object on the Tuner API.
_LEGACY_KEYWORDS = {
    "max_failures": "failure_config=ray.tune.FailureConfig(max_failures=...)",
    "keep_checkpoints_num": "checkpoint_config=ray.tune.CheckpointConfig(num_to_keep=...)",
    "checkpoint_score_attr": "checkpoint_config=ray.tune.CheckpointConfig(checkpoint_score_attribute=...)",
}
# What the trainer's `objective` holds on a resumed trial until it evaluates (the reference's placeholder).
_RESUMED = "objective"


class MissingBackendError(ImportError, RuntimeError):
    """The search backend is not installed. Also a RuntimeError, the type the reference raises for a missing backend."""


def import_ray_tune() -> Any:
    """Import `ray.tune`, or raise the missing-backend error naming the extra that installs it."""
    try:
        import ray.tune  # lazy: Ray is an optional extra and heavy to import
    except ImportError as error:
        raise MissingBackendError(
            "hyperparameter_search(backend='ray') needs Ray Tune, which is not installed: run "
            "`pip install -e \".[ray]\"` from a checkout (or `pip install 'ray[tune]'`)."
        ) from error
    return ray.tune


def default_hp_space_ray(trial: Any) -> dict[str, Any]:
    """The reference's default Ray Tune search space: learning rate, epochs, seed and train batch size."""
    tune = import_ray_tune()
    return {
        "learning_rate": tune.loguniform(1e-6, 1e-4),
        "num_train_epochs": tune.choice(list(range(1, 6))),
        "seed": tune.uniform(1, 40),
        "per_device_train_batch_size": tune.choice([4, 8, 16, 32, 64]),
    }


def tuner_configs(tune: Any, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The reference's `tune.run` keywords sorted into `TuneConfig` and `RunConfig` keywords; others refused."""
    tune_fields = {f.name for f in dataclasses.fields(tune.TuneConfig)} - {"num_samples"}
    run_fields = {f.name for f in dataclasses.fields(tune.RunConfig)} - {"local_dir"}
    tune_kwargs, run_kwargs, unknown = {}, {}, []
    for name, value in kwargs.items():
        if name in tune_fields:
            tune_kwargs[name] = value
        elif name in run_fields:
            run_kwargs[name] = value
        elif name == "local_dir":
            raise ValueError(
                "hyperparameter_search(backend='ray', local_dir=...): Ray has removed `local_dir`; "
                "pass storage_path=... instead."
            )
        elif name in _LEGACY_KEYWORDS:
            raise ValueError(
                f"hyperparameter_search(backend='ray', {name}=...): on Ray's Tuner API this is "
                f"{_LEGACY_KEYWORDS[name]}; pass that instead."
            )
        else:
            unknown.append(name)
    if unknown:
        raise ValueError(
            f"hyperparameter_search(backend='ray') got keyword(s) {unknown} that neither ray.tune.TuneConfig nor "
            f"ray.tune.RunConfig takes. Accepted: resources_per_trial, scaling_config, resume, {sorted(tune_fields | run_fields)}."
        )
    return tune_kwargs, run_kwargs


class SearchedTrainer(TrialTrainer, Protocol):
    """The trainer a Ray Tune search starts from: its trials' trainer (`TrialTrainer`), the search space, and the
    model it sends to the trials without (each trial's `model_init` builds one)."""

    model: Any  # nn.Module, None while the trials run
    model_wrapped: Any
    hp_space: Callable[[Any], dict[str, Any]]  # set by hyperparameter_search


def _check_scheduler(args: Any, scheduler: Any) -> None:
    """A scheduler that acts on intermediate reports needs evaluation during training (the reference's check)."""
    # lazy: Ray's schedulers, only when one is passed; the reference's list of those that act on intermediate reports
    from ray.tune.schedulers import (
        ASHAScheduler,
        HyperBandForBOHB,
        MedianStoppingRule,
        PopulationBasedTraining,
    )

    report_driven = (ASHAScheduler, MedianStoppingRule, HyperBandForBOHB, PopulationBasedTraining)
    name = type(scheduler).__name__
    if isinstance(scheduler, report_driven) and (
        not args.do_eval or enum_value(args.eval_strategy) == "no"
    ):
        raise RuntimeError(
            f"You are using {name} as a scheduler but you haven't enabled evaluation during training. "
            "This means your trials will not report intermediate results to Ray Tune, and "
            f"can thus not be stopped early or used to exploit other trials parameters. "
            f"If this is what you want, do not use {name}. If you would like to use {name}, "
            "make sure you pass `do_eval=True` and `eval_strategy='steps'` in the Trainer `args`."
        )


def _resumed_checkpoint_path(checkpoint_dir: str) -> str:
    """The `checkpoint-*` folder inside a trial checkpoint Ray hands back."""
    found = sorted(Path(checkpoint_dir).glob(f"{PREFIX_CHECKPOINT_DIR}-*"))
    if not found:
        raise FileNotFoundError(f"Ray Tune's checkpoint {checkpoint_dir} holds no {PREFIX_CHECKPOINT_DIR}-* folder.")
    return found[-1].as_posix()


def _objective(config: dict[str, Any], local_trainer: TrialTrainer) -> None:
    """One trial (in a Ray worker): train on `config`, continuing from Tune's checkpoint when it hands one back."""
    tune = import_ray_tune()
    local_trainer.objective = None
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        # A finished trial resumed from its last checkpoint must not report once more (the reference's placeholder).
        local_trainer.objective = _RESUMED
        with checkpoint.as_directory() as checkpoint_dir:
            local_trainer.train(resume_from_checkpoint=_resumed_checkpoint_path(checkpoint_dir), trial=config)
    else:
        local_trainer.train(trial=config)
    if local_trainer.objective is None:
        metrics = local_trainer.evaluate()
        local_trainer.objective = local_trainer.compute_objective(metrics)
        metrics.update(objective_metrics(local_trainer.objective))
        metrics["done"] = True
        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            local_trainer._tune_save_checkpoint(checkpoint_dir=temp_checkpoint_dir)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(temp_checkpoint_dir))


def report_trial_to_ray(trainer: TrialTrainer, metrics: dict[str, Any]) -> None:
    """After a training-time evaluation: `tune.report` the metrics and the objective, with a trial checkpoint
    from `_tune_save_checkpoint` when this step saves (the reference's order)."""
    if worker_trial_id(trainer) is not None:
        report_from_worker(trainer, metrics, save=trainer.control.should_save)
        return
    tune = import_ray_tune()
    metrics = metrics | objective_metrics(trainer.objective)
    with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
        checkpoint = None
        if trainer.control.should_save:
            trainer._tune_save_checkpoint(checkpoint_dir=temp_checkpoint_dir)
            checkpoint = tune.Checkpoint.from_directory(temp_checkpoint_dir)
        tune.report(metrics, checkpoint=checkpoint)


def _resources(args: Any, kwargs: dict[str, Any]) -> Any:
    """`resources_per_trial`, by default 1 CPU (and 1 GPU when the trainer sees one), as the reference."""
    resources = kwargs.pop("resources_per_trial", None)
    if resources is None:
        resources = {"cpu": 1}
        if args.n_gpu > 0:
            resources["gpu"] = 1
        logger.info(f"No `resources_per_trial` arg was passed into `hyperparameter_search`. Using {resources}.")
    return resources


def run_hp_search_ray(trainer: SearchedTrainer, n_trials: int, direction: str | list[str], **kwargs: Any) -> Any:
    """The reference's Ray Tune runner on `ray.tune.Tuner`: `n_trials` samples of `hp_space(None)`, one `train()`
    each in a Ray worker (on `scaling_config`'s Ray Train workers when given, integrations/ray_tune_workers.py);
    the best trial by `objective` under `RAY_SCOPE` (default "last")."""
    tune = import_ray_tune()
    scaling_config, resume = kwargs.pop("scaling_config", None), kwargs.pop("resume", None)
    if scaling_config is not None:
        problem = scaling_config_problem(scaling_config, kwargs.get("resources_per_trial"))
        if problem is not None:
            raise ValueError(f"hyperparameter_search(backend='ray', scaling_config=...): {problem}.")
        resources = DRIVER_RESOURCES
    else:
        resources = _resources(trainer.args, kwargs)
    if "progress_reporter" not in kwargs:
        kwargs["progress_reporter"] = tune.CLIReporter(metric_columns=["objective"])
    tune_kwargs, run_kwargs = tuner_configs(tune, kwargs)
    run_config = tune.RunConfig(**run_kwargs)
    if tune_kwargs.get("scheduler") is not None:
        _check_scheduler(trainer.args, tune_kwargs["scheduler"])
    directions = direction if isinstance(direction, list) else [direction]
    for one in directions:
        if one not in ("minimize", "maximize"):
            raise ValueError(f"hyperparameter_search: direction {one!r} is neither 'minimize' nor 'maximize'.")
    ray_scope = os.getenv("RAY_SCOPE", "last")
    if len(directions) > 1 and ray_scope != "last":
        raise ValueError(
            f"hyperparameter_search(backend='ray') with several directions compares each trial's last report; "
            f"RAY_SCOPE={ray_scope!r} is for one objective. Unset RAY_SCOPE (or ray_scope) or set it to 'last'."
        )

    restore = search_to_restore(tune, resume, run_config)
    # The model is rebuilt by `model_init` in each trial; the trainer travels to the workers without it.
    model, trainer.model = trainer.model, None
    model_wrapped, trainer.model_wrapped = trainer.model_wrapped, None
    handlers = _signal_handlers()
    try:
        if scaling_config is not None:
            trainable = trial_on_workers(trainer, scaling_config, run_kwargs.get("storage_path"))
        else:
            trainable = tune.with_parameters(_objective, local_trainer=trainer)
        trainable = tune.with_resources(trainable, resources)
        if restore is not None:
            path, flags = restore
            tuner = tune.Tuner.restore(
                path, trainable, param_space=trainer.hp_space(None),
                storage_filesystem=run_config.storage_filesystem, **flags,
            )
        else:
            tuner = tune.Tuner(
                trainable,
                param_space=trainer.hp_space(None),
                tune_config=tune.TuneConfig(num_samples=n_trials, **tune_kwargs),
                run_config=run_config,
            )
        results = tuner.fit()
    finally:
        trainer.model, trainer.model_wrapped = model, model_wrapped
        _restore_signal_handlers(handlers)
    analysis = tune.ExperimentAnalysis(results.experiment_path, storage_filesystem=results.filesystem)
    if len(directions) == 1:
        best_trial = analysis.get_best_trial(metric="objective", mode=directions[0][:3], scope=ray_scope)
        if best_trial is None:
            raise RuntimeError(f"Ray Tune finished with no trial that reported an objective ({results.num_errors} failed).")
        return BestRun(best_trial.trial_id, best_trial.last_result["objective"], best_trial.config, analysis)
    return _pareto_front(analysis, directions)


def _signal_handlers() -> dict[int, Any]:
    """SIGINT and SIGUSR1's handlers (Ray Tune's driver replaces both for the search and keeps its own after)."""
    numbers = [signal.SIGINT] + ([signal.SIGUSR1] if hasattr(signal, "SIGUSR1") else [])
    return {number: signal.getsignal(number) for number in numbers}


def _restore_signal_handlers(handlers: dict[int, Any]) -> None:
    """Put the handlers back, so a later `train()` (Lightning's SLURM requeue on SIGUSR1) sees the process's own."""
    if threading.current_thread() is not threading.main_thread():
        return  # Tune could not install any outside the main thread
    for number, handler in handlers.items():
        if handler is not None:
            signal.signal(number, handler)


def _pareto_front(analysis: Any, directions: list[str]) -> list[BestRun]:
    """The trials no other trial dominates on their last reported objectives, in trial order (optuna's meaning)."""
    signs = [1.0 if d == "minimize" else -1.0 for d in directions]
    reported = [t for t in analysis.trials if isinstance((t.last_result or {}).get("objective"), list)]
    scored = [(t, [s * v for s, v in zip(signs, t.last_result["objective"])]) for t in reported]

    def dominated(values: list[float]) -> bool:
        return any(
            all(o <= v for o, v in zip(other, values)) and any(o < v for o, v in zip(other, values))
            for _, other in scored
        )

    return [
        BestRun(trial.trial_id, trial.last_result["objective"], trial.config, analysis)
        for trial, values in scored
        if not dominated(values)
    ]
