"""A Ray Tune trial on several Ray Train workers (`hyperparameter_search(backend="ray",
scaling_config=ScalingConfig(num_workers=2))`), which the reference's single-process trials cannot: each trial of
the search trains on 2 CPU workers of one local Ray cluster and ends with the objectives of the same trials run
single-process with the same global batch."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: `pip install -e \".[ray]\"` runs these tests")
from ray import tune  # noqa: E402
from ray.train import ScalingConfig  # noqa: E402

from hf_lightning import Trainer, TrainingArguments  # noqa: E402
from hf_lightning.checkpoint.files import checkpoint_problem  # noqa: E402
from tests.integrations.ray_cluster import local_ray_cluster  # noqa: E402
from tests.integrations.test_ray_tune import EVAL, LEARNING_RATES, TRAIN, model_init  # noqa: E402

SEARCH_SECONDS = 300
GLOBAL_BATCH = 4


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    """One local Ray cluster for the module: the 2 workers of one trial and the trials' drivers (a sliver each)."""
    with local_ray_cluster(num_cpus=3, RAY_SCOPE="last"):
        yield


@pytest.fixture(autouse=True)
def bounded():
    def expire(signum, frame):
        raise TimeoutError(f"a Ray Tune search ran over {SEARCH_SECONDS} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(SEARCH_SECONDS)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _space(trial):
    return {"learning_rate": tune.grid_search(LEARNING_RATES), "model_seed": 3}


def _trainer(out: Path, per_device: int) -> Trainer:
    args = TrainingArguments(
        output_dir=str(out), num_train_epochs=2, per_device_train_batch_size=per_device, eval_strategy="steps",
        eval_steps=2, save_steps=2, report_to="none", use_cpu=True, disable_tqdm=True,
    )
    return Trainer(model_init=model_init, args=args, train_dataset=TRAIN, eval_dataset=EVAL)


def _search(trainer: Trainer, out: Path, name: str, **kwargs):
    return trainer.hyperparameter_search(
        hp_space=_space, backend="ray", n_trials=1, storage_path=str(out / "ray"), name=name, verbose=0, **kwargs
    )


def _by_learning_rate(best) -> dict[float, dict]:
    return {t.config["learning_rate"]: t.last_result for t in best.run_summary.trials}


@pytest.mark.slow
def test_trials_on_two_workers_match_the_same_trials_run_single_process(tmp_path):
    """2 trials, each on 2 Ray Train workers (2 per device x 2 workers): every evaluation reaches Tune, the last
    objectives equal the single-process trials' (4 per device) to 1e-6, the best run is theirs, and each reported
    trial checkpoint holds both workers' files (one RNG state per process) and is complete."""
    single = _search(_trainer(tmp_path / "single", GLOBAL_BATCH), tmp_path, "single")
    workers = _search(
        _trainer(tmp_path / "workers", GLOBAL_BATCH // 2), tmp_path, "workers",
        scaling_config=ScalingConfig(num_workers=2),
    )
    single_results, worker_results = _by_learning_rate(single), _by_learning_rate(workers)
    assert sorted(worker_results) == sorted(single_results) == LEARNING_RATES
    for lr in LEARNING_RATES:
        result = worker_results[lr]
        assert result["training_iteration"] == single_results[lr]["training_iteration"] == 4  # 8 steps, eval_steps=2
        assert result["objective"] == pytest.approx(single_results[lr]["objective"], rel=1e-6, abs=1e-7)
        assert result["eval_loss"] == result["objective"]
        folder = Path(result["checkpoint_path"])
        (checkpoint,) = folder.glob("checkpoint-*")
        assert checkpoint.name == "checkpoint-8" and checkpoint_problem(str(checkpoint)) is None
        assert sorted(p.name for p in checkpoint.glob("rng_state_*.pth")) == ["rng_state_0.pth", "rng_state_1.pth"]
    assert workers.hyperparameters == single.hyperparameters
    assert workers.objective == pytest.approx(single.objective, rel=1e-6, abs=1e-7)
    assert workers.objective == min(r["objective"] for r in worker_results.values())
    # Each trial's own run folder, named by its trial id as a single-process trial's.
    for trial in workers.run_summary.trials:
        assert (tmp_path / "workers" / f"run-{trial.trial_id}" / "checkpoint-8").is_dir()


def test_scaling_config_is_refused_where_it_cannot_apply(tmp_path):
    """Not Ray Train's ScalingConfig, with resources_per_trial, or on optuna: a clear error before any trial."""
    trainer = _trainer(tmp_path / "refused", GLOBAL_BATCH)
    for keywords, message in (
        ({"scaling_config": {"num_workers": 2}}, r"scaling_config must be a ray.train.ScalingConfig, got dict"),
        (
            {"scaling_config": ScalingConfig(num_workers=2), "resources_per_trial": {"cpu": 1}},
            r"resources_per_trial and scaling_config were both given.*resources_per_worker",
        ),
    ):
        with pytest.raises(ValueError, match=message):
            trainer.hyperparameter_search(hp_space=_space, backend="ray", **keywords)
    with pytest.raises(ValueError, match=r"backend='optuna', scaling_config=...\): trials on several Ray Train"):
        trainer.hyperparameter_search(backend="optuna", scaling_config=ScalingConfig(num_workers=2))
    assert trainer.model is not None and trainer.hp_search_backend is None
    assert not (tmp_path / "refused").exists() or not list((tmp_path / "refused").glob("run-*"))
