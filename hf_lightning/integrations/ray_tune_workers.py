"""A Ray Tune trial that trains on several Ray Train workers (`hyperparameter_search(backend="ray",
scaling_config=ray.train.ScalingConfig(num_workers=N))`), which the reference's single-process trials cannot.

Ray's documented pattern for Train V2 under Tune: each trial is a driver function that fits a `TorchTrainer` on the
trial's config, and `ray.tune.integration.ray_train.TuneReportCallback` forwards rank 0's `ray.train.report`s to
Tune, so schedulers see every evaluation. Each worker runs `train(trial=config)` on a copy of the trainer in the
process group Ray set up; every worker reports (Ray Train gathers one report from all), each with its own files of
the step's trial checkpoint, which Ray merges into one folder. Ray places the workers and restarts a failed group
(`failure_config`), handing the group its last report through `ray.train.get_checkpoint()`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any, Protocol

__all__ = [
    "objective_metrics",
    "report_from_worker", "scaling_config_problem", "trial_on_workers",
    "worker_trial_id",
]

class TrialTrainer(Protocol):
    """The trainer as a Ray Tune trial runs it: train on the trial's config, evaluate, report the objective and
    the trial checkpoint of `_tune_save_checkpoint` (the reference's override point)."""

    args: Any  # TrainingArguments
    control: Any  # callbacks.state.TrainerControl: whether the reporting step saves
    objective: Any  # the last computed objective (a float, or a list for several directions); None before one
    _ray_worker_trial_id: str | None  # the Tune trial a worker's copy runs for (`_train_on_worker`); None elsewhere
    compute_objective: Callable[[dict[str, float]], Any]  # set by hyperparameter_search

    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None) -> Any: ...
    def evaluate(self) -> dict[str, float]: ...
    def _tune_save_checkpoint(self, checkpoint_dir: str) -> None: ...


# The driver function only waits on its TorchTrainer: the workers hold the trial's resources. Tune refuses a trial of
# no resources; a sliver of a CPU keeps the drivers from holding the CPUs their workers wait for.
DRIVER_RESOURCES = {"cpu": 0.01}


def scaling_config_problem(scaling_config: Any, resources_per_trial: Any) -> str | None:
    """Why `scaling_config` cannot be used (None when it can): it must be Ray Train's `ScalingConfig`, and it
    replaces `resources_per_trial` (the workers' resources are its `resources_per_worker`)."""
    from ray.train import ScalingConfig  # lazy: Ray is an optional extra, imported by the search already

    if not isinstance(scaling_config, ScalingConfig):
        return f"scaling_config must be a ray.train.ScalingConfig, got {type(scaling_config).__name__}"
    if resources_per_trial is not None:
        return (
            "resources_per_trial and scaling_config were both given: a trial on Ray Train workers takes its "
            "resources from ScalingConfig(num_workers=..., use_gpu=..., resources_per_worker=...); drop "
            "resources_per_trial"
        )
    return None


def worker_trial_id(trainer: TrialTrainer) -> str | None:
    """The Tune trial id a worker of a multi-worker trial runs for (Tune's context lives in the driver only); set
    on the worker's copy of the trainer only (`_train_on_worker`); None elsewhere (the facade's class default)."""
    return trainer._ray_worker_trial_id


def trial_on_workers(trainer: TrialTrainer, scaling_config: Any, storage_path: str | None) -> Callable[[dict[str, Any]], None]:
    """The Tune trainable: fit a `TorchTrainer` of `scaling_config`'s workers on the trial's config, its reports
    forwarded to Tune; the Train run is stored beside the search (`storage_path`, Ray's default when None)."""

    def driver(config: dict[str, Any]) -> None:
        import ray.train  # lazy: the optional extra, in the trial's driver process
        from ray import tune  # lazy: as above
        from ray.train.torch import TorchTrainer  # lazy: as above
        from ray.tune.integration.ray_train import TuneReportCallback  # lazy: as above

        context = tune.get_context()
        trial_id = context.get_trial_id()

        def train_loop_per_worker(worker_config: dict[str, Any]) -> None:
            _train_on_worker(trainer, worker_config["trial"], trial_id)

        run_config = ray.train.RunConfig(
            name=f"{context.get_experiment_name()}_{trial_id}_workers", storage_path=storage_path,
            callbacks=[TuneReportCallback()],
        )
        TorchTrainer(
            train_loop_per_worker, train_loop_config={"trial": config}, scaling_config=scaling_config,
            run_config=run_config,
        ).fit()

    return driver


def _train_on_worker(trainer: TrialTrainer, config: dict[str, Any], trial_id: str) -> None:
    """One worker of a trial: train on the trial's config (a group Ray restarted continues from Ray's checkpoint,
    checkpoint/restart.py), and evaluate at the end when training never did, as a one-process trial."""
    trainer._ray_worker_trial_id = trial_id
    trainer.args.__dict__.pop("_resolved_device", None)  # resolved on the search's driver: this worker's is Ray's
    trainer.objective = None
    trainer.train(trial=dict(config))
    if trainer.objective is None:
        metrics = trainer.evaluate()
        trainer.objective = trainer.compute_objective(metrics)
        report_from_worker(trainer, metrics | {"done": True}, save=True)


def report_from_worker(trainer: TrialTrainer, metrics: dict[str, Any], save: bool) -> None:
    """`ray.train.report` from every worker: the metrics, and when `save` this worker's files of the step's trial
    checkpoint (`_tune_save_checkpoint`), which Ray merges into the one folder of the report."""
    import ray.train  # lazy: the optional extra, in a Ray Train worker

    metrics = metrics | objective_metrics(trainer.objective)
    with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
        checkpoint = None
        if save:
            trainer._tune_save_checkpoint(checkpoint_dir=temp_checkpoint_dir)
            checkpoint = ray.train.Checkpoint.from_directory(temp_checkpoint_dir)
        ray.train.report(metrics, checkpoint=checkpoint)


def objective_metrics(objective: Any) -> dict[str, Any]:
    """`objective` as reported: a number, or for several objectives the list plus `objective_<i>` for each."""
    if isinstance(objective, (list, tuple)):
        values = [float(v) for v in objective]
        return {"objective": values} | {f"objective_{i}": v for i, v in enumerate(values)}
    return {"objective": objective}
