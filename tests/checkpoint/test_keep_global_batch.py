"""`HF_LIGHTNING_KEEP_GLOBAL_BATCH=1`: a resume whose processes make another global batch recomputes
gradient_accumulation_steps to the checkpoint's, says so, and continues the uninterrupted run (to 1e-6: the
accumulation is summed in another order); without the switch the existing warning says the global batch changed."""

from __future__ import annotations

import logging

import pytest
import torch

from hf_lightning import TrainingArguments
from hf_lightning.checkpoint.global_batch import KEEP_GLOBAL_BATCH_ENV, accumulation_keeping_global_batch
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.checkpoint.test_resume_safety import StopAt
from tests.models import make_regression_mlp, regression_data

# 16 items; the saving run takes 2 per device x 1 process x accumulation 2 = 4 samples per update, 4 updates per
# epoch, 8 updates; it saves every 2.
SAVING = dict(
    use_cpu=True, report_to="none", disable_tqdm=True, per_device_train_batch_size=2,
    gradient_accumulation_steps=2, max_steps=8, save_steps=2, logging_steps=1, learning_rate=0.05,
)  # fmt: skip


def _trainer(output_dir, callbacks=(), **changes) -> HFLightningTrainer:
    return HFLightningTrainer(
        model=make_regression_mlp(0),
        args=TrainingArguments(output_dir=str(output_dir), **{**SAVING, **changes}),
        train_dataset=regression_data(16),
        callbacks=list(callbacks),
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    uninterrupted = _trainer(tmp_path_factory.mktemp("straight"))
    uninterrupted.train()
    stopped_dir = tmp_path_factory.mktemp("stopped")
    _trainer(stopped_dir, [StopAt(4)]).train()
    return uninterrupted, stopped_dir / "checkpoint-4"


def test_the_resume_keeps_the_checkpoints_global_batch(runs, tmp_path, monkeypatch, caplog):
    uninterrupted, checkpoint = runs
    monkeypatch.setenv(KEEP_GLOBAL_BATCH_ENV, "1")
    # The restarted job's processes make 4 per device (as twice the processes at 2 would): accumulation 2 -> 1.
    resumed = _trainer(tmp_path, per_device_train_batch_size=4)
    with caplog.at_level(logging.WARNING):
        resumed.train(resume_from_checkpoint=str(checkpoint))
    assert f"{KEEP_GLOBAL_BATCH_ENV}=1: gradient_accumulation_steps 2 -> 1" in caplog.text
    assert "samples per update" in caplog.text and "this run takes" not in caplog.text  # no global-batch warning
    assert resumed.args.gradient_accumulation_steps == 1 and resumed.state.global_step == 8
    losses = [(e["step"], e["loss"]) for e in resumed.state.log_history if "loss" in e and e["step"] > 4]
    expected = [(e["step"], e["loss"]) for e in uninterrupted.state.log_history if "loss" in e and e["step"] > 4]
    assert [step for step, _ in losses] == [step for step, _ in expected]
    assert [loss for _, loss in losses] == pytest.approx([loss for _, loss in expected], rel=1e-6, abs=1e-7)
    for name, value in uninterrupted.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], value, rtol=1e-6, atol=1e-6)


def test_without_the_switch_the_global_batch_changes_with_a_warning(runs, tmp_path, monkeypatch, caplog):
    _, checkpoint = runs
    monkeypatch.delenv(KEEP_GLOBAL_BATCH_ENV, raising=False)
    resumed = _trainer(tmp_path, per_device_train_batch_size=4, max_steps=5)
    with caplog.at_level(logging.WARNING):
        resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.args.gradient_accumulation_steps == 2
    assert "taking 4 samples per update and this run takes 8" in caplog.text


def test_a_global_batch_the_processes_cannot_make_is_refused_before_training(runs, tmp_path, monkeypatch):
    _, checkpoint = runs
    monkeypatch.setenv(KEEP_GLOBAL_BATCH_ENV, "1")
    resumed = _trainer(tmp_path, per_device_train_batch_size=3)
    with pytest.raises(ValueError, match=r"global batch of 4 samples per update.*per_device_train_batch_size=3"):
        resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 0


@pytest.mark.parametrize(
    ("environ", "per_device", "processes", "accumulation", "expected"),
    [
        ({}, 2, 1, 1, None),  # the switch unset
        ({KEEP_GLOBAL_BATCH_ENV: "1"}, 2, 1, 2, None),  # the same global batch
        ({KEEP_GLOBAL_BATCH_ENV: "1"}, 2, 2, 2, 1),  # twice the processes: half the accumulation
        ({KEEP_GLOBAL_BATCH_ENV: "1"}, 1, 1, 2, 4),  # half the per-device batch: twice the accumulation
    ],
)
def test_the_accumulation_kept(runs, environ, per_device, processes, accumulation, expected):
    _, checkpoint = runs  # saved with 4 samples per update
    assert accumulation_keeping_global_batch(str(checkpoint), per_device, processes, accumulation, environ) == expected
