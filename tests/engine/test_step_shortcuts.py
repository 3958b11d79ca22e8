"""Per-step shortcuts change nothing a user can see: Lightning's `self.log`, train mode, column removal."""

from __future__ import annotations

import copy

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import Logger
from torch import nn

import hf_lightning.engine.lean_logging as lean_logging
from hf_lightning import TrainerCallback, TrainingArguments
from hf_lightning.data.collate import RemoveColumnsCollator, default_data_collator
from hf_lightning.engine.lean_logging import LeanLoggerConnector
from hf_lightning.engine.step_methods import ensure_train_mode
from hf_lightning.engine.trainer import HFLightningTrainer
from tests.parity.models import RegressionMLP, make_regression_mlp, regression_data


def _args(tmp_path, **overrides) -> TrainingArguments:
    options = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        per_device_train_batch_size=3,
        num_train_epochs=2,
        logging_steps=2,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=5,
    )
    options.update(overrides)
    return TrainingArguments(**options)


# ---- Lightning's logger connector ------------------------------------------------------------------------
TIMINGS = ("runtime", "per_second")  # wall-clock speed metrics differ from run to run


def _without_timings(metrics: dict) -> dict:
    return {k: float(v) for k, v in metrics.items() if not any(word in k for word in TIMINGS)}


class RecordingLogger(Logger):
    """Keeps every `log_metrics` call, tensors turned into floats."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[dict, int | None]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> str:
        return "0"

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.calls.append((_without_timings(metrics), step))


class LogsFromCallback(pl.Callback):
    """A user's Lightning callback that logs through `pl_module.log` from the batch-end hook."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pl_module.log("probe", float(batch_idx) + 0.5, on_step=True, on_epoch=False, batch_size=3)


def _run_with_lightning_logging(tmp_path, lean: bool, monkeypatch) -> tuple[list, dict, type]:
    if not lean:
        monkeypatch.setattr(lean_logging, "use_lean_logger_connector", lambda trainer: None)
    recorder = RecordingLogger()
    trainer = HFLightningTrainer(
        model=make_regression_mlp(),
        args=_args(tmp_path, logging_steps=1),
        train_dataset=regression_data(12),
        callbacks=[LogsFromCallback()],
    )
    trainer.lightning_trainer_overrides["logger"] = recorder
    trainer.train()
    monkeypatch.undo()
    lightning_trainer = trainer.lightning_trainer
    callback_metrics = _without_timings(lightning_trainer.callback_metrics)
    return recorder.calls, callback_metrics, type(lightning_trainer._logger_connector)


def test_values_logged_by_a_lightning_callback_reach_the_loggers_as_without_the_shortcut(tmp_path, monkeypatch):
    lean_calls, lean_metrics, lean_type = _run_with_lightning_logging(tmp_path / "lean", True, monkeypatch)
    plain_calls, plain_metrics, plain_type = _run_with_lightning_logging(tmp_path / "plain", False, monkeypatch)
    assert lean_type is LeanLoggerConnector and plain_type is not LeanLoggerConnector
    assert any("probe" in metrics for metrics, _ in lean_calls)  # Lightning's own path did run
    assert lean_calls == plain_calls
    assert lean_metrics == plain_metrics and "probe" in lean_metrics


# ---- train mode ------------------------------------------------------------------------------------------
class ModeRecordingMLP(RegressionMLP):
    def __init__(self) -> None:
        super().__init__()
        self.modes: list[bool] = []

    def forward(self, x, labels=None):
        self.modes.append(all(module.training for module in self.modules()))
        return super().forward(x, labels)


class EvalOnStepBegin(TrainerCallback):
    def on_step_begin(self, args, state, control, model=None, **kwargs):
        model.eval()


def test_a_model_switched_to_eval_trains_in_train_mode_again(tmp_path):
    torch.manual_seed(0)
    model = ModeRecordingMLP()
    trainer = HFLightningTrainer(
        model=model, args=_args(tmp_path), train_dataset=regression_data(12), callbacks=[EvalOnStepBegin()]
    )
    trainer.train()
    assert len(model.modes) == 8 and all(model.modes)


class FrozenNorm(nn.LayerNorm):
    """A submodule whose `train()` keeps it in eval mode (as models with frozen normalisation do)."""

    def train(self, mode: bool = True):
        self.train_calls = getattr(self, "train_calls", 0) + 1
        return super().train(False)


def test_train_is_still_called_when_a_submodule_overrides_it():
    model = make_regression_mlp()
    model.norm = FrozenNorm(4)
    ensure_train_mode(model)
    ensure_train_mode(model)
    assert model.norm.train_calls == 2 and not model.norm.training and model.net.training


def test_train_is_skipped_only_when_it_would_change_nothing():
    calls = []
    model = make_regression_mlp()
    model.train = lambda mode=True: calls.append(mode)  # a spy on this instance; the class keeps Module.train
    ensure_train_mode(model)  # every module is in train mode already
    assert calls == []
    model.net[1].training = False
    ensure_train_mode(model)
    assert calls == [True]


# ---- column removal --------------------------------------------------------------------------------------
def test_column_removal_without_copies_gives_the_same_batch_and_leaves_examples_alone():
    columns = ["x", "labels"]
    kept = [{"x": torch.tensor([float(i), 1.0]), "labels": torch.tensor(float(i))} for i in range(4)]
    extra = [dict(item, idx=i) for i, item in enumerate(kept)]
    before = copy.deepcopy(extra)
    fast = RemoveColumnsCollator(default_data_collator, columns)(kept)
    dropped = RemoveColumnsCollator(default_data_collator, columns)(extra)
    through_copies = RemoveColumnsCollator(lambda features: default_data_collator(features), columns)(kept)
    for batch in (dropped, through_copies):
        assert batch.keys() == fast.keys() == {"x", "labels"}
        for key in fast:
            assert torch.equal(batch[key], fast[key])
    assert [item.keys() for item in extra] == [item.keys() for item in before]
