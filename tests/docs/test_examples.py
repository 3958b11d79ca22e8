"""The example scripts run as a user would run them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_train_classifier_example(tmp_path):
    completed = subprocess.run(
        [sys.executable, "examples/train_classifier.py", "--output_dir", str(tmp_path), "--max_steps", "20"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "TrainOutput(global_step=20" in completed.stdout
    assert "eval_accuracy" in completed.stdout
    assert (tmp_path / "model.safetensors").exists()
    assert json.loads((tmp_path / "vocab.json").read_text())  # the processing class is saved too
