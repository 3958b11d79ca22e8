"""A resume that cannot continue the saved run's data says so before training: the completion marker records the
saving run's global batch (samples per update), and a resume taking another one warns (the process-count matrix
itself is tests/strategies/test_resharding.py)."""

from __future__ import annotations

import json
import logging

from hf_lightning import Trainer, TrainingArguments
from hf_lightning.core.checkpoint_files import COMPLETE_MARKER_NAME
from tests.models import make_regression_mlp, regression_data


def _run(tmp_path, name: str, batch: int, accumulation: int, resume=None) -> Trainer:
    args = TrainingArguments(
        str(tmp_path / name),
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=accumulation,
        max_steps=4,
        save_steps=2,
        learning_rate=1e-2,
    )
    trainer = Trainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(16))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_the_marker_records_the_global_batch_and_another_one_is_warned_before_training(tmp_path, caplog):
    _run(tmp_path, "saved", batch=2, accumulation=2)
    checkpoint = tmp_path / "saved" / "checkpoint-2"
    marker = json.loads((checkpoint / COMPLETE_MARKER_NAME).read_text())
    assert marker == {"global_step": 2, "format": 1, "samples_per_update": 4}
    with caplog.at_level(logging.WARNING, logger="hf_lightning.checkpoint.resume"):
        _run(tmp_path, "same", batch=4, accumulation=1, resume=str(checkpoint))  # 4 x 1 = 2 x 2: no warning
        assert "samples per update" not in caplog.text
        _run(tmp_path, "other", batch=2, accumulation=1, resume=str(checkpoint))
    assert "taking 4 samples per update and this run takes 2" in caplog.text
    assert "gradient_accumulation_steps = 4" in caplog.text
