"""Logs reach Lightning: its loggers get log_history's keys and steps; its monitoring callbacks see eval metrics."""

from __future__ import annotations

import csv
import glob

import lightning.pytorch as pl
import pytest

from hf_lightning import TrainingArguments
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.models import make_regression_mlp, regression_data


def _train(tmp_path, callbacks=None, **kwargs):
    args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        **kwargs,
    )
    trainer = HFLightningTrainer(
        model=make_regression_mlp(),
        args=args,
        train_dataset=regression_data(8),
        eval_dataset=regression_data(4, seed=1),
        callbacks=callbacks,
    )
    trainer.train()
    return trainer


def test_csv_and_tensorboard_receive_the_log_history(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = _train(
        tmp_path, report_to=["csv", "tensorboard"], logging_steps=1, num_train_epochs=2, eval_strategy="epoch"
    )
    history = trainer.state.log_history
    train_losses = {e["step"]: e["loss"] for e in history if "loss" in e}
    eval_losses = {e["step"]: e["eval_loss"] for e in history if "eval_loss" in e}

    (metrics_file,) = glob.glob(str(tmp_path / "**" / "metrics.csv"), recursive=True)
    rows = list(csv.DictReader(open(metrics_file)))
    csv_losses = {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}
    csv_eval = {int(r["step"]): float(r["eval/loss"]) for r in rows if r.get("eval/loss")}
    assert csv_losses == pytest.approx(train_losses, rel=1e-6)
    assert csv_eval == pytest.approx(eval_losses, rel=1e-6)
    assert any(r.get("train/train_loss") for r in rows)  # the final summary, logged after fit

    (run_dir,) = glob.glob(str(tmp_path / "runs" / "*"))  # output_dir/runs/<date>_<host>, as the reference
    accumulator = EventAccumulator(run_dir)
    accumulator.Reload()
    scalars = {e.step: e.value for e in accumulator.Scalars("train/loss")}
    assert scalars == pytest.approx(train_losses, rel=1e-6)


def test_lightning_early_stopping_monitors_eval_loss(tmp_path):
    stopper = pl.callbacks.EarlyStopping(
        monitor="eval_loss", patience=0, mode="min", min_delta=10.0, check_on_train_epoch_end=True
    )
    trainer = _train(
        tmp_path, report_to="none", num_train_epochs=5, eval_strategy="epoch", callbacks=[stopper]
    )
    # No epoch improves eval_loss by 10, so Lightning's EarlyStopping ends the run after the second epoch.
    assert trainer.state.global_step == 8
    assert float(trainer.lightning_trainer.callback_metrics["eval_loss"]) == pytest.approx(
        [e["eval_loss"] for e in trainer.state.log_history if "eval_loss" in e][-1]
    )
