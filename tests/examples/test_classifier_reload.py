"""examples/train_classifier.py leaves a model that reloads the way the script says, with the same predictions."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import torch

from hf_lightning.cli.embedded import (
    DEFAULT_EVAL_SIZE,
    EmbeddedCollator,
    EmbeddedDataset,
    EmbeddedTokenizer,
    TinyTransformerClassifier,
    generate_examples,
)

ROOT = Path(__file__).resolve().parents[2]


def test_saved_example_model_reloads_as_printed(tmp_path):
    completed = subprocess.run(
        [sys.executable, "examples/train_classifier.py", "--output_dir", str(tmp_path), "--max_steps", "20"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert f"TinyTransformerClassifier.from_pretrained({str(tmp_path)!r})" in completed.stdout

    # The last such line is evaluate()'s metrics dict (the progress printer's rounded log comes before it).
    printed = next(line for line in reversed(completed.stdout.splitlines()) if line.startswith("{'eval_loss'"))
    eval_accuracy = ast.literal_eval(printed)["eval_accuracy"]

    model = TinyTransformerClassifier.from_pretrained(tmp_path).eval()
    tokenizer = EmbeddedTokenizer.from_pretrained(tmp_path)
    dataset = EmbeddedDataset(generate_examples(DEFAULT_EVAL_SIZE, 42, "eval"), tokenizer)
    batch = EmbeddedCollator(tokenizer.pad_token_id)([dataset[index] for index in range(len(dataset))])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])["logits"]
    reloaded_accuracy = float((logits.argmax(-1) == batch["labels"]).float().mean())
    # The reloaded weights are the trained ones: the same accuracy as the script's own evaluate().
    assert abs(reloaded_accuracy - eval_accuracy) < 1e-6, (reloaded_accuracy, eval_accuracy)
