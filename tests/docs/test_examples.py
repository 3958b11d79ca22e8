"""The example scripts run as a user would run them, and leave what they say they leave."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
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


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One run of examples/train_classifier.py, shared by the tests of what it prints and saves."""
    output_dir = tmp_path_factory.mktemp("train_classifier")
    completed = subprocess.run(
        [sys.executable, "examples/train_classifier.py", "--output_dir", str(output_dir), "--max_steps", "20"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return output_dir, completed


def test_train_classifier_example(classifier_run):
    output_dir, completed = classifier_run
    assert "TrainOutput(global_step=20" in completed.stdout
    assert "eval_accuracy" in completed.stdout
    assert (output_dir / "model.safetensors").exists()
    assert json.loads((output_dir / "vocab.json").read_text())  # the processing class is saved too


def test_saved_example_model_reloads_as_printed(classifier_run):
    output_dir, completed = classifier_run
    assert f"TinyTransformerClassifier.from_pretrained({str(output_dir)!r})" in completed.stdout

    # The last such line is evaluate()'s metrics dict (the progress printer's rounded log comes before it).
    printed = next(line for line in reversed(completed.stdout.splitlines()) if line.startswith("{'eval_loss'"))
    eval_accuracy = ast.literal_eval(printed)["eval_accuracy"]

    model = TinyTransformerClassifier.from_pretrained(output_dir).eval()
    tokenizer = EmbeddedTokenizer.from_pretrained(output_dir)
    dataset = EmbeddedDataset(generate_examples(DEFAULT_EVAL_SIZE, 42, "eval"), tokenizer)
    batch = EmbeddedCollator(tokenizer.pad_token_id)([dataset[index] for index in range(len(dataset))])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])["logits"]
    reloaded_accuracy = float((logits.argmax(-1) == batch["labels"]).float().mean())
    # The reloaded weights are the trained ones: the same accuracy as the script's own evaluate().
    assert abs(reloaded_accuracy - eval_accuracy) < 1e-6, (reloaded_accuracy, eval_accuracy)


def test_sft_trl_example_trains_offline(tmp_path):
    """examples/sft_trl.py: TRL's SFTTrainer on the embedded chat data learns (its loss falls) and saves."""
    completed = subprocess.run(
        [sys.executable, "-W", "error::FutureWarning", "examples/sft_trl.py", "--output_dir", str(tmp_path),
         "--max_steps", "30"],  # no deprecation warning from the example's own arguments
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "TrainOutput(global_step=30" in completed.stdout
    logged = [ast.literal_eval(line) for line in completed.stdout.splitlines() if line.startswith("{'loss'")]
    assert len(logged) == 3 and float(logged[-1]["loss"]) < float(logged[0]["loss"])
    assert (tmp_path / "model.safetensors").exists() and (tmp_path / "tokenizer.json").exists()


def test_sentence_transformers_example_trains_on_lightning_offline(tmp_path):
    """examples/sentence_transformers_on_lightning.py: the real all-MiniLM-L6-v2, offline, on one thread it sets
    itself (its time is a benchmark's business, not this test's)."""
    completed = subprocess.run(
        [sys.executable, "examples/sentence_transformers_on_lightning.py", "--output_dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**{k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}, "HF_HUB_OFFLINE": "1"},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "TrainOutput(global_step=8" in completed.stdout
    assert "trained by lightning.pytorch.trainer.trainer.Trainer" in completed.stdout
    before = ast.literal_eval(completed.stdout.split("before training: ", 1)[1].splitlines()[0])
    after = ast.literal_eval(completed.stdout.split("after training: ", 1)[1].splitlines()[0])
    assert after != before  # the model was trained

    from sentence_transformers import SentenceTransformer

    assert SentenceTransformer(str(tmp_path), device="cpu").encode(["a test"]).shape == (1, 384)


@pytest.mark.parametrize("script", ["train_classifier.py", "sft_trl.py"])
def test_examples_train_on_one_thread_unless_told(script, tmp_path, monkeypatch):
    """With torch's default threads a busy 2-core machine ran train_classifier.py in 197 s instead of 9 s; the
    examples set one thread themselves (`--num_threads`), as `hf-lightning` does, whatever OMP_NUM_THREADS says."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"example_{tmp_path.name}", ROOT / "examples" / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    chosen = []

    class Stop(Exception):
        pass

    def record_then_stop(count: int) -> None:
        chosen.append(count)
        raise Stop  # the threads are set before anything is built: no need to train

    monkeypatch.setattr(torch, "set_num_threads", record_then_stop)
    for argv, expected in (([], 1), (["--num_threads", "3"], 3)):
        monkeypatch.setattr(sys, "argv", [script, "--output_dir", str(tmp_path), *argv])
        with pytest.raises(Stop):
            module.main()
        assert chosen[-1] == expected


@pytest.mark.parametrize("action", ["rollback", "skip"])
def test_run_guard_example_survives_the_bad_batch(tmp_path, action):
    completed = subprocess.run(
        [sys.executable, "examples/run_guard.py", "--output_dir", str(tmp_path), "--action", action],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "TrainOutput(global_step=40" in completed.stdout
    assert "'step': 13, 'metric': 'loss', 'value': nan" in completed.stdout and f"'action': '{action}'" in completed.stdout
    assert "final loss nan" not in completed.stdout
