"""log_level sets hf_lightning's own loggers too: the training banner shows at "info", as in the reference."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.no_transformers import BLOCK_TRANSFORMERS

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


@pytest.mark.parametrize(
    ("log_level", "shown", "transformers_installed"),
    [("info", True, True), ("debug", True, True), ("warning", False, True), ("info", True, False)],
)
def test_the_running_training_banner_follows_log_level(tmp_path, log_level, shown, transformers_installed):
    # With transformers the banner goes to its logger (prefixed "[transformers] "), without it to ours.
    script = SCRIPT if transformers_installed else BLOCK_TRANSFORMERS + SCRIPT
    completed = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "out"), log_level],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert ("***** Running training *****" in completed.stderr) is shown, completed.stderr[-3000:]
    printed = [line.removeprefix("[transformers] ") for line in completed.stderr.splitlines()]
    assert ("[transformers] ***** Running training *****" in completed.stderr) is (shown and transformers_installed)
    if shown:  # every line of the reference's banner
        for line in ("  Num update steps per epoch = 1", "  Instantaneous batch size per device = 8",
                     "  Total train batch size (w. parallel, distributed & accumulation) = 8",
                     "  Gradient Accumulation steps = 1", "  Total optimization steps = 1",
                     "  Number of trainable parameters = 3"):  # fmt: skip
            assert line in printed, (line, completed.stderr[-3000:])
