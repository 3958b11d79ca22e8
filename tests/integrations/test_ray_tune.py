"""Hyperparameter search with Ray Tune: ours against `transformers.Trainer`'s own Ray backend, on one local Ray
cluster for the module (2 CPUs), same tiny `model_init(trial)`, data and trial hyperparameters."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray", reason="Ray is not installed: `pip install -e \".[ray]\"` runs these tests")
import ray.train  # noqa: E402, F401, F811  (a trial whose process has imported ray.train, as a script using both)
import transformers  # noqa: E402
from ray import tune  # noqa: E402

from hf_lightning import TrainingArguments  # noqa: E402
from hf_lightning.callbacks import TrainerCallback  # noqa: E402
from hf_lightning.integrations.hp_search import default_hp_space_ray  # noqa: E402
from hf_lightning.trainer.trainer import HFLightningTrainer  # noqa: E402
from tests.integrations.ray_cluster import local_ray_cluster  # noqa: E402
from tests.models import LinearRegressor  # noqa: E402

LEARNING_RATES = [1e-3, 3e-2]
SEARCH_SECONDS = 240  # each search is bounded; a hung cluster fails the test instead of the CI job


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    """One local Ray cluster for the module; its workers import this checkout's `tests` package."""
    with local_ray_cluster(RAY_SCOPE="last"):
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


def _dataset(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(n, generator=generator)
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


TRAIN, EVAL = _dataset(16, 0), _dataset(8, 1)


def model_init(trial):
    """The trial's config picks the initial weights (`model_seed` is no TrainingArguments field: warned, skipped)."""
    return LinearRegressor(seed=None if trial is None else int(trial["model_seed"]))


def _space(trial):
    return {"learning_rate": tune.grid_search(LEARNING_RATES), "model_seed": 3}


class SavingRecorder(HFLightningTrainer):
    """An override of `_tune_save_checkpoint`: called by our search, it leaves a file in each trial checkpoint."""

    def _tune_save_checkpoint(self, checkpoint_dir: str) -> None:
        super()._tune_save_checkpoint(checkpoint_dir)
        Path(checkpoint_dir, "override_called").write_text(str(self.state.global_step))


def _trainer(side: str, out: Path, callbacks=(), **fields):
    cls = transformers.TrainingArguments if side == "reference" else TrainingArguments
    trainer_cls = transformers.Trainer if side == "reference" else SavingRecorder
    args = cls(
        output_dir=str(out / side), num_train_epochs=2, per_device_train_batch_size=4, eval_strategy="steps",
        eval_steps=2, save_steps=2, report_to="none", use_cpu=True, disable_tqdm=True, **fields,
    )
    return trainer_cls(
        model_init=model_init, args=args, train_dataset=TRAIN, eval_dataset=EVAL, callbacks=list(callbacks)
    )


def _by_learning_rate(best) -> dict[float, dict]:
    return {t.config["learning_rate"]: t.last_result for t in best.run_summary.trials}


def _search(trainer, out: Path, name: str, **kwargs):
    return trainer.hyperparameter_search(
        hp_space=_space, backend="ray", n_trials=1, storage_path=str(out / "ray"), name=name, verbose=0, **kwargs
    )


@pytest.mark.slow
def test_search_matches_the_reference_ray_backend(tmp_path):
    """Same trial hyperparameters -> the same objective at every report; the same best run; each report of a saving
    step carries a complete `checkpoint-<step>` written by our (overridden) `_tune_save_checkpoint`."""
    # accelerate's process-wide GradientState keeps weak references to the dataloaders of earlier reference runs in
    # this test process, and the reference's Ray backend pickles its trainer (accelerator included): start it clean.
    from accelerate.state import GradientState

    GradientState._reset_state()
    reference = _search(_trainer("reference", tmp_path), tmp_path, "reference")
    ours = _search(_trainer("ours", tmp_path), tmp_path, "ours")

    assert isinstance(ours.run_summary, tune.ExperimentAnalysis)
    ours_results, reference_results = _by_learning_rate(ours), _by_learning_rate(reference)
    assert sorted(ours_results) == sorted(reference_results) == LEARNING_RATES
    for lr in LEARNING_RATES:
        # One report per evaluation: 8 steps, eval_steps=2.
        assert ours_results[lr]["training_iteration"] == reference_results[lr]["training_iteration"] == 4
        assert ours_results[lr]["objective"] == pytest.approx(reference_results[lr]["objective"], rel=1e-6, abs=1e-7)
        assert ours_results[lr]["eval_loss"] == ours_results[lr]["objective"]
    assert ours.hyperparameters == reference.hyperparameters
    assert ours.objective == pytest.approx(reference.objective, rel=1e-6)
    assert ours.run_id in {t.trial_id for t in ours.run_summary.trials}

    for trial in ours.run_summary.trials:
        trial_dir = Path(trial.path)
        stored = sorted(trial_dir.glob("checkpoint_*"))
        assert len(stored) == 4
        for iteration, folder in enumerate(stored, 1):
            (checkpoint,) = folder.glob("checkpoint-*")
            step = 2 * iteration
            assert checkpoint.name == f"checkpoint-{step}"
            assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == step
            assert (checkpoint / "hf_lightning_complete.json").is_file()
            assert (folder / "override_called").read_text() == str(step)
        # The trial's own run folder, as the reference names it.
        assert (tmp_path / "ours" / f"run-{trial.trial_id}" / "checkpoint-8").is_dir()


class CrashOnce(TrainerCallback):
    """Ends the first attempt of a trial whose config says `crash` at step 5, after the step-4 report."""

    def __init__(self, marker: str):
        self.marker = marker

    def on_step_end(self, args, state, control, **kwargs):
        if state.trial_params.get("crash") and state.global_step == 5 and not os.path.exists(self.marker):
            Path(self.marker).write_text("crashed")
            raise RuntimeError("a simulated lost trial")


@pytest.mark.slow
def test_a_failed_trial_resumes_from_tune_checkpoint_exactly(tmp_path):
    """With `failure_config`, Ray restarts a failed trial; it continues from `tune.get_checkpoint()` (step 4)
    and ends with the objective of the same trial run without a failure."""
    marker = str(tmp_path / "crashed")
    trainer = _trainer("ours", tmp_path, callbacks=[CrashOnce(marker)], seed=7)
    best = trainer.hyperparameter_search(
        hp_space=lambda trial: {"learning_rate": 3e-2, "model_seed": 3, "crash": tune.grid_search([False, True])},
        backend="ray", n_trials=1, storage_path=str(tmp_path / "ray"), name="resume", verbose=0,
        failure_config=tune.FailureConfig(max_failures=1),
    )
    assert Path(marker).read_text() == "crashed"
    trials = {t.config["crash"]: t for t in best.run_summary.trials}
    assert trials[True].num_failures == 1 and trials[False].num_failures == 0
    assert trials[True].last_result["objective"] == trials[False].last_result["objective"]
    assert trials[True].last_result["training_iteration"] == trials[False].last_result["training_iteration"] == 4


def _mine(signum, frame):
    return None


def test_several_objectives_return_the_pareto_front(tmp_path):
    """A list of directions: every trial reports its objectives; the front is the trials no other dominates. Ray
    Tune's driver replaces SIGINT and SIGUSR1 for the search and keeps them after; ours puts the process's own
    back, so a later run's SIGUSR1 (Lightning's SLURM requeue) and Ctrl+C are not Ray's."""
    previous, interrupt = signal.signal(signal.SIGUSR1, _mine), signal.getsignal(signal.SIGINT)
    try:
        best = _search(
            _trainer("ours", tmp_path), tmp_path, "pareto", direction=["minimize", "minimize"],
            compute_objective=lambda metrics: [metrics["eval_loss"], 2 * metrics["eval_loss"]],
        )
        assert signal.getsignal(signal.SIGUSR1) is _mine and signal.getsignal(signal.SIGINT) is interrupt
    finally:
        signal.signal(signal.SIGUSR1, previous)
    results = _by_learning_rate(best[0])
    assert isinstance(best, list) and len(best) == 1
    winner = min(results, key=lambda lr: results[lr]["objective_0"])
    assert best[0].hyperparameters["learning_rate"] == winner
    assert best[0].objective == [results[winner]["objective_0"], results[winner]["objective_1"]]


def test_bad_keywords_are_refused_before_any_trial(tmp_path, monkeypatch):
    """A keyword neither TuneConfig nor RunConfig takes, Ray's removed names, `resume` without the search's name or
    with a value `tune.run` does not take, a report-driven scheduler without evaluation and a scope other than 'last'
    for several objectives: each a clear error, no trial started."""
    trainer = _trainer("ours", tmp_path)
    for keywords, message in (
        ({"not_a_ray_option": 1}, r"\['not_a_ray_option'\].*neither ray.tune.TuneConfig"),
        ({"local_dir": "x"}, r"pass storage_path"),
        ({"keep_checkpoints_num": 2}, r"CheckpointConfig\(num_to_keep"),
        ({"resume": True}, r"resume=True\) restores the search stored at storage_path/name: pass the interrupted"),
        ({"resume": "LOCAL", "name": "x"}, r"Ray has removed 'LOCAL'; pass True, False or \"AUTO\""),
        ({"resume": "AUTO+ERRORD", "name": "x"}, r"resume='AUTO\+ERRORD'\): resume takes True, False or \"AUTO\""),
    ):
        with pytest.raises(ValueError, match=message):
            trainer.hyperparameter_search(hp_space=_space, backend="ray", **keywords)
    from ray.tune.schedulers import ASHAScheduler

    no_eval = _trainer("ours", tmp_path)
    no_eval.args.eval_strategy = "no"
    with pytest.raises(RuntimeError, match="AsyncHyperBandScheduler as a scheduler but you haven't enabled evaluation"):
        no_eval.hyperparameter_search(hp_space=_space, backend="ray", scheduler=ASHAScheduler())
    monkeypatch.setenv("RAY_SCOPE", "all")
    with pytest.raises(ValueError, match="RAY_SCOPE='all' is for one objective"):
        trainer.hyperparameter_search(hp_space=_space, backend="ray", direction=["minimize", "maximize"])
    assert trainer.model is not None and trainer.hp_search_backend is None
    assert not list((tmp_path / "ours").glob("run-*"))


def test_default_space_is_the_reference():
    ours, reference = default_hp_space_ray(None), transformers.trainer_utils.default_hp_space_ray(None)
    assert sorted(ours) == sorted(reference)
    assert ours["per_device_train_batch_size"].categories == reference["per_device_train_batch_size"].categories
    assert ours["num_train_epochs"].categories == reference["num_train_epochs"].categories
    assert (ours["learning_rate"].lower, ours["learning_rate"].upper) == (1e-6, 1e-4)
    assert (ours["seed"].lower, ours["seed"].upper) == (1, 40)



@pytest.mark.parametrize(
    "resume", [True, "AUTO", "AUTO+ERRORED", "AUTO+RESTART_ERRORED", "AUTO+ERRORED_ONLY", "AUTO+RESTART_ERRORED_ONLY"]
)
def test_resume_restores_as_tune_run_would(resume, monkeypatch):
    """Each `resume` value the reference hands to `ray.tune.run` reaches `Tuner.restore` as the ResumeConfig that
    `tune.run` builds from it (Ray's own parser); False and None start a new search."""
    from ray.tune import tuner as tuner_module
    from ray.tune.tune import _build_resume_config_from_legacy_config

    from hf_lightning.integrations.ray_tune_restore import restore_keywords

    built = {}
    monkeypatch.setattr(tuner_module, "TunerInternal", lambda **kwargs: built.update(kwargs) or object())
    tune.Tuner.restore("unused", trainable=lambda config: None, **restore_keywords(resume))
    assert built["resume_config"] == _build_resume_config_from_legacy_config(resume)
    assert restore_keywords(False) is None and restore_keywords(None) is None
