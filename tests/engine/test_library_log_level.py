"""log_level sets hf_lightning's own loggers too: the training banner shows at "info", as in the reference."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from hf_lightning import Trainer, TrainingArguments

    class Regressor(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 1)

        def forward(self, x, labels=None):
            return {"loss": ((self.linear(x).squeeze(-1) - labels) ** 2).mean()}

    data = [{"x": torch.ones(2), "labels": torch.tensor(1.0)}] * 4
    args = TrainingArguments(output_dir=sys.argv[1], log_level=sys.argv[2], max_steps=1, report_to="none",
                             use_cpu=True, disable_tqdm=True, save_strategy="no")
    Trainer(model=Regressor(), args=args, train_dataset=data).train()
    """
)


@pytest.mark.parametrize(("log_level", "shown"), [("info", True), ("debug", True), ("warning", False)])
def test_the_running_training_banner_follows_log_level(tmp_path, log_level, shown):
    completed = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "out"), log_level],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert ("***** Running training *****" in completed.stderr) is shown, completed.stderr[-3000:]
