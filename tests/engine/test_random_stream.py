"""Python's `random` stream after Trainer construction and through training is transformers.Trainer's, also
when nothing imported rich (which Lightning pulls in, and which draws at import) before the Trainer.

Each side runs in a fresh interpreter, so no earlier import of this test session hides the draw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, random, sys

    import torch
    from torch import nn

    if sys.argv[1] == "reference":
        from transformers import Trainer, TrainerCallback, TrainingArguments
    else:
        from hf_lightning import Trainer, TrainerCallback, TrainingArguments
    rich_before = "rich" in sys.modules


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 1)

        def forward(self, x, labels=None):
            out = self.linear(x).squeeze(-1)
            return {"loss": ((out - labels) ** 2).mean(), "logits": out}


    draws = {"collator": []}


    def collate(features):
        # Like DataCollatorForWholeWordMask, which picks the words to mask with `random`.
        draws["collator"].append(random.random())
        return {"x": torch.stack([f["x"] for f in features]), "labels": torch.stack([f["labels"] for f in features])}


    def peek():
        state = random.getstate()
        value = random.random()
        random.setstate(state)
        return value


    class Peek(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            draws["train_begin"] = peek()


    data = [{"x": torch.full((2,), float(i)), "labels": torch.tensor(float(i))} for i in range(8)]
    args = TrainingArguments(
        output_dir=sys.argv[2], use_cpu=True, report_to="none", max_steps=3, save_strategy="no",
        disable_tqdm=True, per_device_train_batch_size=2, seed=11,
    )
    trainer = Trainer(model=Model(), args=args, train_dataset=data, data_collator=collate, callbacks=[Peek()])
    draws["after_init"] = peek()
    trainer.train()
    print(json.dumps({"rich_before": rich_before, **draws}))
    """
)


def _draws(side: str, tmp_path: Path) -> dict:
    completed = subprocess.run(
        [sys.executable, "-c", SCRIPT, side, str(tmp_path / side)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two fresh interpreters, each importing torch and its trainer
def test_random_stream_matches_the_reference_without_rich_imported_first(tmp_path):
    reference, ours = _draws("reference", tmp_path), _draws("ours", tmp_path)
    assert not ours["rich_before"], "rich was imported before the Trainer: the test would not see its draw"
    assert ours["after_init"] == reference["after_init"]
    assert ours["train_begin"] == reference["train_begin"]
    assert len(reference["collator"]) >= 3
    assert ours["collator"] == reference["collator"]
