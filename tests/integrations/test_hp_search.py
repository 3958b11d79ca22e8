"""Hyperparameter search with optuna (HPO-5): ours against `transformers.Trainer`'s.

Both sides get the same tiny regression `model_init`, data and seeded sampler; each study lives in a storage
so the tests can read its trials (states, values, intermediate values) after the search.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import optuna
import pytest
import torch
import transformers
from transformers import trainer_utils as reference_utils

from hf_lightning import TrainingArguments
from hf_lightning.callbacks import TrainerCallback
from hf_lightning.integrations import hp_search
from hf_lightning.integrations.hp_search import (
    BestRun,
    HPSearchBackend,
    MissingBackendError,
    default_compute_objective,
    default_hp_space_optuna,
)
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.models import LinearRegressor

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(autouse=True, scope="module")
def _frozen_heap():
    """Both runners `gc.collect()` after every trial; freezing the imported libraries' objects makes that cheap."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


LEARNING_RATES = [1e-3, 3e-2, 1e-1]


def tiny_regression() -> LinearRegressor:
    """A linear regressor returning `{"loss", "logits"}`; a model_init without arguments."""
    return LinearRegressor()


def _dataset(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(n, generator=generator)
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


TRAIN, EVAL = _dataset(16, 0), _dataset(8, 1)


def _grid_space(trial) -> dict[str, Any]:
    # `bogus_param` is no TrainingArguments field: warned about and skipped. `num_train_epochs` is cast to float.
    return {
        "learning_rate": trial.suggest_float("learning_rate", 1e-4, 1.0, log=True),
        "num_train_epochs": 2,
        "bogus_param": 1,
    }


@dataclass
class SearchResult:
    best: Any
    study: optuna.Study
    trainer: Any
    init_seeds: list[int]
    train_begins: list[tuple] = field(default_factory=list)
    train_ends: int = 0
    folders: dict[str, list[str]] = field(default_factory=dict)


def _recorder(base: type, result: SearchResult, fail_on_trial: int | None = None):
    class Recorder(base):
        def on_train_begin(self, args, state, control, **kwargs):
            result.train_begins.append(
                (
                    args.learning_rate,
                    args.num_train_epochs,
                    type(args.num_train_epochs).__name__,
                    args.per_device_train_batch_size,
                    args.seed,
                    state.is_hyper_param_search,
                    state.trial_name,
                    state.trial_params,
                )
            )
            if fail_on_trial is not None and len(result.train_begins) == fail_on_trial + 1:
                raise RuntimeError("simulated crash")

        def on_train_end(self, args, state, control, **kwargs):
            result.train_ends += 1

    return Recorder()


def _folders(root: str) -> dict[str, list[str]]:
    if not os.path.isdir(root):
        return {}
    runs = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    return {run: sorted(os.listdir(os.path.join(root, run))) for run in runs}


def _search(
    side: str,
    out_dir,
    *,
    storage: Any = None,
    study_name: str = "study",
    args: dict | None = None,
    fail_on_trial: int | None = None,
    compute_metrics=None,
    **search_kwargs,
) -> SearchResult:
    """Run `hyperparameter_search` with the reference ("ref") or ours ("ours") and collect what it left."""
    storage = storage if storage is not None else optuna.storages.InMemoryStorage()
    reference = side == "ref"
    init_seeds: list[int] = []

    def model_init(trial):
        init_seeds.append(torch.initial_seed())
        return tiny_regression()

    merged = {
        "report_to": "none",
        "disable_tqdm": True,
        "max_steps": 4,
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 4,
        "eval_strategy": "steps",
        "eval_steps": 2,
        "save_steps": 2,
        "logging_steps": 2,
        "learning_rate": 1e-2,
        "use_cpu": True,
        **(args or {}),
    }
    args_cls, trainer_cls = (
        (transformers.TrainingArguments, transformers.Trainer)
        if reference
        else (TrainingArguments, HFLightningTrainer)
    )
    result = SearchResult(None, None, None, init_seeds)
    trainer = trainer_cls(
        model_init=model_init,
        args=args_cls(output_dir=str(out_dir), **merged),
        train_dataset=TRAIN,
        eval_dataset=EVAL,
        compute_metrics=compute_metrics,
        callbacks=[
            _recorder(transformers.TrainerCallback if reference else TrainerCallback, result, fail_on_trial)
        ],
    )
    result.trainer = trainer
    try:
        result.best = trainer.hyperparameter_search(
            backend="optuna", storage=storage, study_name=study_name, **search_kwargs
        )
    finally:
        result.study = optuna.load_study(study_name=study_name, storage=storage)
        result.folders = _folders(str(out_dir))
    return result


def _trial_summary(study: optuna.Study) -> list[tuple]:
    return [(t.number, t.state, t.params, t.values, t.intermediate_values) for t in study.trials]


def _assert_same_trials(ours: optuna.Study, reference: optuna.Study) -> None:
    assert len(ours.trials) == len(reference.trials)
    for our_trial, ref_trial in zip(ours.trials, reference.trials):
        assert (our_trial.number, our_trial.state, our_trial.params) == (
            ref_trial.number,
            ref_trial.state,
            ref_trial.params,
        )
        assert our_trial.distributions == ref_trial.distributions
        if ref_trial.values is None:
            assert our_trial.values is None
        else:
            assert our_trial.values == pytest.approx(ref_trial.values, rel=1e-6, abs=1e-9)
        assert sorted(our_trial.intermediate_values) == sorted(ref_trial.intermediate_values)
        for step, value in ref_trial.intermediate_values.items():
            assert our_trial.intermediate_values[step] == pytest.approx(value, rel=1e-6, abs=1e-9)


def _assert_same_best(ours: BestRun, reference: Any) -> None:
    assert isinstance(ours, BestRun)
    assert ours.run_id == reference.run_id
    assert ours.objective == pytest.approx(reference.objective, rel=1e-6, abs=1e-9)
    assert ours.hyperparameters == reference.hyperparameters
    assert ours.run_summary is None and reference.run_summary is None


def _without_marker(folders: dict[str, list[str]]) -> dict[str, list[str]]:
    return {
        run: [name for name in names if name != "hf_lightning_complete.json"]
        for run, names in folders.items()
    }


def test_grid_search_matches_reference(tmp_path, caplog):
    """3 grid trials: same BestRun, trial values, run-N folders, args per trial and model_init seeds."""
    kwargs = dict(hp_space=_grid_space, n_trials=3)
    reference = _search(
        "ref",
        tmp_path / "ref",
        sampler=optuna.samplers.GridSampler({"learning_rate": LEARNING_RATES}, seed=0),
        **kwargs,
    )
    with caplog.at_level(logging.WARNING, logger="hf_lightning.trainer.hp_search_methods"):
        ours = _search(
            "ours",
            tmp_path / "ours",
            sampler=optuna.samplers.GridSampler({"learning_rate": LEARNING_RATES}, seed=0),
            **kwargs,
        )
    _assert_same_best(ours.best, reference.best)
    _assert_same_trials(ours.study, reference.study)
    assert list(ours.folders) == list(reference.folders) == ["run-0", "run-1", "run-2"]
    for run in ("run-0", "run-1", "run-2"):
        assert [d for d in ours.folders[run] if d.startswith("checkpoint-")] == [
            "checkpoint-2",
            "checkpoint-4",
        ]
    # What each trial trained with: lr from the trial, num_train_epochs cast to the field's type (float).
    assert ours.train_begins == reference.train_begins
    assert {row[2] for row in ours.train_begins} == {"float"}
    assert ours.init_seeds == reference.init_seeds and len(ours.init_seeds) == 1 + 3
    assert ours.trainer.args.learning_rate == reference.trainer.args.learning_rate
    assert ours.trainer.hp_search_backend is None and reference.trainer.hp_search_backend is None
    assert ours.trainer.model is None and reference.trainer.model is None  # freed after each trial
    ours_warnings = [
        r for r in caplog.records if r.name == "hf_lightning.trainer.hp_search_methods" and "bogus_param" in r.getMessage()
    ]
    assert len(ours_warnings) == 3


def test_search_picks_the_trial_with_the_lowest_independent_objective(tmp_path):
    """The best run's objective and learning rate equal the argmin of eval_loss from separate plain trainings."""
    search = _search(
        "ours",
        tmp_path / "search",
        hp_space=_grid_space,
        n_trials=3,
        sampler=optuna.samplers.GridSampler({"learning_rate": LEARNING_RATES}, seed=0),
    )
    independent = {}
    for lr in LEARNING_RATES:
        args = TrainingArguments(
            output_dir=str(tmp_path / f"plain-{lr}"),
            report_to="none",
            disable_tqdm=True,
            max_steps=4,
            per_device_train_batch_size=4,
            per_device_eval_batch_size=4,
            learning_rate=lr,
            num_train_epochs=2,
            save_strategy="no",
            use_cpu=True,
        )
        trainer = HFLightningTrainer(
            model_init=tiny_regression, args=args, train_dataset=TRAIN, eval_dataset=EVAL
        )
        trainer.train()
        independent[lr] = trainer.evaluate()["eval_loss"]
    best_lr = min(independent, key=independent.get)
    assert len(set(independent.values())) == 3  # the learning rates really lead to different losses
    assert search.best.hyperparameters == {"learning_rate": best_lr}
    assert search.best.objective == pytest.approx(independent[best_lr], rel=1e-6)
    by_lr = {t.params["learning_rate"]: t.value for t in search.study.trials}
    assert by_lr == pytest.approx(independent, rel=1e-6)
    assert search.folders[f"run-{search.best.run_id}"]  # the best run's folder exists


def test_multi_objective_returns_the_pareto_front_as_the_reference(tmp_path):
    """A list of directions: a list of BestRun (objective = list of values), same as the reference's."""

    def objectives(metrics):
        return metrics["eval_loss"], metrics["eval_mae"]

    def mae(prediction):
        return {"mae": float(abs(prediction.predictions - prediction.label_ids).mean())}

    kwargs = dict(
        hp_space=_grid_space,
        n_trials=3,
        direction=["minimize", "maximize"],
        compute_objective=objectives,
        compute_metrics=mae,
        args={"eval_steps": 4, "save_strategy": "no"},
    )
    reference = _search(
        "ref",
        tmp_path / "ref",
        sampler=optuna.samplers.GridSampler({"learning_rate": LEARNING_RATES}, seed=0),
        **kwargs,
    )
    ours = _search(
        "ours",
        tmp_path / "ours",
        sampler=optuna.samplers.GridSampler({"learning_rate": LEARNING_RATES}, seed=0),
        **kwargs,
    )
    assert isinstance(ours.best, list) and len(ours.best) == len(reference.best) >= 1
    for our_run, ref_run in zip(ours.best, reference.best):
        _assert_same_best(our_run, ref_run)
        assert len(our_run.objective) == 2
    _assert_same_trials(ours.study, reference.study)
    assert all(not t.intermediate_values for t in ours.study.trials)  # multi-objective studies never report


def _enqueued_storage(learning_rates: list[float]) -> optuna.storages.InMemoryStorage:
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, study_name="study")
    for lr in learning_rates:
        study.enqueue_trial({"learning_rate": lr})
    return storage


def test_median_pruner_stops_a_bad_trial_as_the_reference(tmp_path):
    """Evaluation every step: a huge-lr trial is PRUNED at its first report, before its first checkpoint."""

    def named(trial):
        return f"trial_{trial.number}_x"

    kwargs = dict(
        hp_space=lambda trial: {"learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e3, log=True)},
        n_trials=3,
        load_if_exists=True,
        hp_name=named,
        args={"max_steps": 3, "eval_steps": 1, "save_steps": 1},
    )
    results = {}
    for side in ("ref", "ours"):
        pruner = optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0)
        storage = _enqueued_storage([1e-2, 500.0, 2e-2])
        results[side] = _search(side, tmp_path / side, storage=storage, pruner=pruner, **kwargs)
    ours, reference = results["ours"], results["ref"]
    states = [t.state for t in ours.study.trials]
    assert states[0] == optuna.trial.TrialState.COMPLETE
    assert states[1] == optuna.trial.TrialState.PRUNED
    assert list(ours.study.trials[1].intermediate_values) == [1]
    _assert_same_trials(ours.study, reference.study)
    _assert_same_best(ours.best, reference.best)
    assert "trial_1_x" not in ours.folders  # pruned at step 1, before the step-1 checkpoint
    assert _without_marker(ours.folders) == reference.folders
    assert ours.train_ends == reference.train_ends == 3  # the pruned trial fires on_train_end too
    assert [row[6] for row in ours.train_begins] == ["trial_0_x", "trial_1_x", "trial_2_x"]


def test_search_in_a_storage_resumes_after_a_crash(tmp_path):
    """A crash in trial 2 leaves it FAIL in the sqlite study; a second call with load_if_exists continues it."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    space = {"hp_space": lambda t: {"learning_rate": t.suggest_float("learning_rate", 1e-3, 1e-1, log=True)}}
    common = dict(storage=storage, study_name="resumable", args={"max_steps": 2, "save_steps": 2}, **space)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _search(
            "ours",
            tmp_path / "out",
            n_trials=4,
            fail_on_trial=2,
            sampler=optuna.samplers.RandomSampler(seed=0),
            **common,
        )
    first = optuna.load_study(study_name="resumable", storage=storage)
    T = optuna.trial.TrialState
    assert [t.state for t in first.trials] == [T.COMPLETE, T.COMPLETE, T.FAIL]

    second = _search(
        "ours",
        tmp_path / "out",
        n_trials=2,
        load_if_exists=True,
        sampler=optuna.samplers.RandomSampler(seed=1),
        **common,
    )
    assert second.trainer.hp_search_backend is None
    trials = second.study.trials
    assert [t.number for t in trials] == [0, 1, 2, 3, 4]
    assert [t.state for t in trials] == [T.COMPLETE, T.COMPLETE, T.FAIL, T.COMPLETE, T.COMPLETE]
    completed = [t for t in trials if t.state == T.COMPLETE]
    best = min(completed, key=lambda t: t.value)
    assert second.best == BestRun(str(best.number), best.value, best.params)
    assert list(second.folders) == ["run-0", "run-1", "run-3", "run-4"]


def test_default_objective_and_space_are_the_reference(tmp_path):
    """default_compute_objective / default_hp_space_optuna give the reference's values and distributions."""
    cases = [
        {"eval_loss": 1.0, "eval_acc": 0.5, "eval_f1": 0.25, "epoch": 1.0, "eval_runtime": 2.0},
        {"eval_loss": 0.3, "epoch": 2.0, "eval_runtime": 1.0, "eval_samples_per_second": 9.0},
        {"eval_loss": 0.3, "eval_model_preparation_time": 0.01, "eval_steps_per_second": 3.0},
    ]
    for metrics in cases:
        before = dict(metrics)
        assert default_compute_objective(metrics) == reference_utils.default_compute_objective(metrics)
        assert metrics == before
    assert default_compute_objective(cases[0]) == 0.75
    assert default_compute_objective(cases[1]) == 0.3

    studies = []
    for space in (default_hp_space_optuna, reference_utils.default_hp_space_optuna):
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        study.optimize(lambda trial, space=space: float(len(space(trial))), n_trials=5)
        studies.append(study)
    ours, reference = studies
    assert [t.params for t in ours.trials] == [t.params for t in reference.trials]
    assert [t.distributions for t in ours.trials] == [t.distributions for t in reference.trials]


def test_default_space_and_objective_in_a_search_match_the_reference(tmp_path):
    """hp_space / compute_objective left None, no evaluation during training: the final evaluate() decides."""

    def metrics(prediction):
        return {"mae": float(abs(prediction.predictions - prediction.label_ids).mean())}

    kwargs = dict(
        n_trials=2,
        compute_metrics=metrics,
        args={"eval_strategy": "no", "save_strategy": "no", "max_steps": -1},
    )
    reference = _search("ref", tmp_path / "ref", sampler=optuna.samplers.RandomSampler(seed=3), **kwargs)
    ours = _search("ours", tmp_path / "ours", sampler=optuna.samplers.RandomSampler(seed=3), **kwargs)
    _assert_same_best(ours.best, reference.best)
    assert set(ours.best.hyperparameters) == {
        "learning_rate",
        "num_train_epochs",
        "seed",
        "per_device_train_batch_size",
    }
    _assert_same_trials(ours.study, reference.study)
    assert ours.train_begins == reference.train_begins
    # The objective is the eval_mae (eval_loss is left out when another metric exists).
    assert ours.init_seeds == reference.init_seeds
    for name in ("learning_rate", "num_train_epochs", "seed", "per_device_train_batch_size"):
        assert getattr(ours.trainer.args, name) == getattr(reference.trainer.args, name)
    assert ours.trainer._train_batch_size == ours.trainer.args.per_device_train_batch_size


def test_refusals_and_requirements(tmp_path, monkeypatch):
    """optuna and ray are the backends; model_init is required; a missing backend names the extra to install, and
    without a name the search takes optuna, else Ray Tune (the reference's order)."""
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", disable_tqdm=True, use_cpu=True)
    trainer = HFLightningTrainer(model_init=tiny_regression, args=args, train_dataset=TRAIN)
    for backend in ("wandb", "sigopt", HPSearchBackend.WANDB):
        with pytest.raises(ValueError, match=r"the 'optuna' and 'ray' backends are supported") as error:
            trainer.hyperparameter_search(backend=backend, n_trials=1)
        assert repr(getattr(backend, "value", backend)) in str(error.value)
    assert trainer.hp_search_backend is None

    with_model = HFLightningTrainer(model=tiny_regression(), args=args, train_dataset=TRAIN)
    with pytest.raises(RuntimeError, match="model_init"):
        with_model.hyperparameter_search(n_trials=1)

    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[optuna\]"') as error:
        trainer.hyperparameter_search(backend="optuna", n_trials=1)
    assert isinstance(error.value, MissingBackendError) and isinstance(error.value, RuntimeError)
    # Without a name: Ray Tune when only Ray is installed; neither installed names both extras.
    monkeypatch.setattr(hp_search, "_installed", lambda module: module == "ray.tune")
    assert hp_search.resolve_backend(None) == HPSearchBackend.RAY
    monkeypatch.setattr(hp_search, "_installed", lambda module: False)
    with pytest.raises(MissingBackendError, match=r'pip install -e "\.\[optuna\]".*pip install -e "\.\[ray\]"'):
        trainer.hyperparameter_search(n_trials=1)
    monkeypatch.setitem(sys.modules, "ray.tune", None)
    with pytest.raises(MissingBackendError, match=r'pip install -e "\.\[ray\]"'):
        trainer.hyperparameter_search(backend="ray", n_trials=1)
