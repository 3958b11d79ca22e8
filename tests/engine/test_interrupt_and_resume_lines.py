"""The lines a user reads when a run stops or resumes: Ctrl+C ends with the resume line on a line of its own and one
line for the interrupt (no screen of traceback scrolling it away); a resume says where it continues."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hf_lightning import Trainer, TrainingArguments
from tests.models import make_regression_mlp, regression_data

ROOT = Path(__file__).resolve().parents[2]
CTRL_C_SCRIPT = """
import sys
from hf_lightning import Trainer, TrainingArguments
from hf_lightning.callbacks import TrainerCallback
from tests.models import make_regression_mlp, regression_data

class CtrlC(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 3:
            raise KeyboardInterrupt

args = TrainingArguments(output_dir=sys.argv[1], use_cpu=True, report_to="none", max_steps=6, save_steps=2,
                         per_device_train_batch_size=2, disable_tqdm=False)
Trainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(12), callbacks=[CtrlC()]).train()
"""


def _interrupted(tmp_path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CTRL_C_SCRIPT, str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True,
        timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )  # fmt: skip


def test_an_uncaught_ctrl_c_ends_with_the_resume_line_and_one_line(tmp_path):
    completed = _interrupted(tmp_path)
    assert completed.returncode in (130, -2), completed.stderr[-3000:]
    lines = completed.stderr.splitlines()
    resume = [line for line in lines if "train() interrupted (Ctrl+C)" in line]
    assert resume == [
        f"hf_lightning: train() interrupted (Ctrl+C) at step 3; last complete checkpoint: {tmp_path / 'out' / 'checkpoint-2'}; "
        f"resume with: trainer.train(resume_from_checkpoint='{tmp_path / 'out' / 'checkpoint-2'}')"
    ]  # a line of its own: not glued to the progress bar's
    assert "Traceback" not in completed.stderr
    assert lines[-1].startswith("KeyboardInterrupt") and lines.index(resume[0]) == len(lines) - 2


def test_the_full_traceback_is_shown_when_asked(tmp_path):
    completed = _interrupted(tmp_path, HF_LIGHTNING_FULL_TRACEBACK="1")
    assert "Traceback" in completed.stderr and "train() interrupted (Ctrl+C)" in completed.stderr


def test_a_resume_says_where_it_continues(tmp_path, capsys):
    def run(resume=None):
        args = TrainingArguments(
            output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=6, save_steps=2,
            per_device_train_batch_size=2, disable_tqdm=True,
        )  # fmt: skip
        Trainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(8)).train(resume_from_checkpoint=resume)
        return capsys.readouterr().err

    assert "resuming" not in run()
    err = run(str(tmp_path / "checkpoint-2"))
    assert f"hf_lightning: resuming from {tmp_path / 'checkpoint-2'} at step 2 of 6 (epoch 0, after its first 2 batches)" in err
