"""A Ray Tune trial on several Ray Train workers (`hyperparameter_search(backend="ray",
scaling_config=ScalingConfig(num_workers=2))`), which the reference's single-process trials cannot: each trial of
the search trains on 2 CPU workers of one local Ray cluster and ends with the objectives of the same trials run
single-process with the same global batch. A search whose driver is killed is restored by the same call run again
(`resume=True`, Ray's `Tuner.restore`) and ends as the uninterrupted one."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: `pip install -e \".[ray]\"` runs these tests")
from ray import tune  # noqa: E402
from ray.train import ScalingConfig  # noqa: E402

from hf_lightning import Trainer, TrainingArguments  # noqa: E402
from hf_lightning.checkpoint.files import checkpoint_problem  # noqa: E402
from tests.integrations import ray_tune_interrupted  # noqa: E402
from tests.integrations.ray_cluster import REPO, local_ray_cluster  # noqa: E402
from tests.integrations.test_ray_tune import EVAL, LEARNING_RATES, TRAIN, model_init  # noqa: E402

SEARCH_SECONDS = 300
GLOBAL_BATCH = 4


@contextmanager
def within(seconds: int):
    """Fail instead of hanging the CI job when a search runs over `seconds`."""

    def expire(signum, frame):
        raise TimeoutError(f"a Ray Tune search ran over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    """One local Ray cluster for the module: the 2 workers of one trial and the trials' drivers (a sliver each)."""
    with local_ray_cluster(num_cpus=3, RAY_SCOPE="last"):
        yield


@pytest.fixture(autouse=True)
def bounded():
    with within(SEARCH_SECONDS):
        yield


@pytest.fixture(scope="module")
def uninterrupted(ray_cluster, tmp_path_factory):
    """The search of 2 trials run through, in one process per trial and on 2 workers per trial (global batch 4)."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    with within(2 * SEARCH_SECONDS):
        searches = {workers: ray_tune_interrupted.search(str(folder), workers, f"w{workers}") for workers in (1, 2)}
    return folder, searches


def _space(trial):
    return {"learning_rate": tune.grid_search(LEARNING_RATES), "model_seed": 3}


def _trainer(out: Path, per_device: int) -> Trainer:
    args = TrainingArguments(
        output_dir=str(out), num_train_epochs=2, per_device_train_batch_size=per_device, eval_strategy="steps",
        eval_steps=2, save_steps=2, report_to="none", use_cpu=True, disable_tqdm=True,
    )
    return Trainer(model_init=model_init, args=args, train_dataset=TRAIN, eval_dataset=EVAL)


def _by_learning_rate(best) -> dict[float, dict]:
    return {t.config["learning_rate"]: t.last_result for t in best.run_summary.trials}


@pytest.mark.slow
def test_trials_on_two_workers_match_the_same_trials_run_single_process(uninterrupted):
    """2 trials, each on 2 Ray Train workers (2 per device x 2 workers): every evaluation reaches Tune, the last
    objectives equal the single-process trials' (4 per device) to 1e-6, the best run is theirs, and each reported
    trial checkpoint holds both workers' files (one RNG state per process) and is complete."""
    folder, searches = uninterrupted
    single, workers = searches[1], searches[2]
    single_results, worker_results = _by_learning_rate(single), _by_learning_rate(workers)
    assert sorted(worker_results) == sorted(single_results) == LEARNING_RATES
    for lr in LEARNING_RATES:
        result = worker_results[lr]
        assert result["training_iteration"] == single_results[lr]["training_iteration"] == 4  # 8 steps, eval_steps=2
        assert result["objective"] == pytest.approx(single_results[lr]["objective"], rel=1e-6, abs=1e-7)
        assert result["eval_loss"] == result["objective"]
        checkpoint_folder = Path(result["checkpoint_path"])
        (checkpoint,) = checkpoint_folder.glob("checkpoint-*")
        assert checkpoint.name == "checkpoint-8" and checkpoint_problem(str(checkpoint)) is None
        assert sorted(p.name for p in checkpoint.glob("rng_state_*.pth")) == ["rng_state_0.pth", "rng_state_1.pth"]
    assert workers.hyperparameters == single.hyperparameters
    assert workers.objective == pytest.approx(single.objective, rel=1e-6, abs=1e-7)
    assert workers.objective == min(r["objective"] for r in worker_results.values())
    # Each trial's own run folder, named by its trial id as a single-process trial's.
    for trial in workers.run_summary.trials:
        assert (folder / "w2" / f"run-{trial.trial_id}" / "checkpoint-8").is_dir()


def _held_trial_reported(experiment: Path) -> str | None:
    """The held trial's id once Tune's saved experiment state holds its step-4 report (its 2nd evaluation)."""
    for state in experiment.glob("experiment_state-*.json"):
        try:
            trials = json.loads(state.read_text())["trial_data"]
        except (json.JSONDecodeError, KeyError):
            continue  # being written
        for trial, metadata in trials:
            trial = json.loads(trial)
            if trial["config"]["learning_rate"] == LEARNING_RATES[0]:
                if json.loads(metadata)["last_result"].get("training_iteration") == 2:
                    return trial["trial_id"]
    return None


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_search_whose_driver_was_killed_is_restored_by_the_same_call(uninterrupted, tmp_path, workers, caplog):
    """The driver (a subprocess on this cluster) runs the search with resume=True (nothing to restore yet: a new
    search, said) and is killed while its first trial is held after its step-4 report. The same call run again
    restores the search (Tuner.restore, said): the held trial keeps its id and continues from its last reported
    checkpoint on every worker; the objectives and best run are the uninterrupted search's to 1e-6."""
    experiment = tmp_path / "ray" / "interrupted"
    address = ray.get_runtime_context().gcs_address
    with open(tmp_path / "driver.log", "w") as log:
        driver = subprocess.Popen(
            [sys.executable, "-m", "tests.integrations.ray_tune_interrupted", address, str(tmp_path), str(workers)],
            cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, stdout=log, stderr=subprocess.STDOUT,
        )
    held = None
    try:
        while held is None:
            assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
            time.sleep(0.5)
            held = _held_trial_reported(experiment) if (tmp_path / "held").exists() else None
    finally:
        driver.kill()
        driver.wait()
    assert "no search to restore at" in (tmp_path / "driver.log").read_text()
    (tmp_path / "release").touch()

    with caplog.at_level(logging.WARNING, logger="hf_lightning.integrations.ray_tune_restore"):
        restored = ray_tune_interrupted.search(str(tmp_path), workers, "interrupted", hold=True, resume=True)
    assert f"restoring the Ray Tune search at {experiment}" in caplog.text
    trials = {t.trial_id: t for t in restored.run_summary.trials}
    assert len(trials) == 2 and trials[held].config["learning_rate"] == LEARNING_RATES[0]
    # Every worker of the held trial started at 0, then continued from a step it reported with a checkpoint before
    # the kill (4, or 2 where Tune's saved state had not caught up with the step-4 report yet).
    starts = (tmp_path / f"starts-{LEARNING_RATES[0]}").read_text().split()
    assert starts[:workers] == ["0"] * workers and len(starts) == 2 * workers
    assert set(starts[workers:]) in ({"4"}, {"2"})
    expected = _by_learning_rate(uninterrupted[1][workers])
    results = _by_learning_rate(restored)
    assert sorted(results) == LEARNING_RATES
    for lr in LEARNING_RATES:
        assert results[lr]["objective"] == pytest.approx(expected[lr]["objective"], rel=1e-6, abs=1e-7)
        assert results[lr]["epoch"] == 2.0
    assert restored.hyperparameters == uninterrupted[1][workers].hyperparameters
    assert restored.objective == pytest.approx(uninterrupted[1][workers].objective, rel=1e-6, abs=1e-7)


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
