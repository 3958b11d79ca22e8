"""`hf-lightning validate --ckpt_path` reports the checkpoint's epoch and step and leaves fit's results files alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from hf_lightning.cli.data_sources import CLI_VOCAB_SIZE
from hf_lightning.cli.lightning_cli import run


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _config(tmp_path: Path) -> str:
    config = {
        "args": {
            "output_dir": str(tmp_path / "run"),
            "seed": 7,
            "num_train_epochs": 2,
            "per_device_train_batch_size": 16,
            "per_device_eval_batch_size": 32,
            "eval_strategy": "epoch",
            "save_strategy": "epoch",
            "report_to": "none",
            "use_cpu": True,
            "disable_tqdm": True,
        },
        "model": {
            "class_path": "hf_lightning.cli.embedded.TinyTransformerClassifier",
            "init_args": {"vocab_size": CLI_VOCAB_SIZE, "d_model": 16, "dim_feedforward": 32, "num_layers": 1},
        },
        "data": {
            "class_path": "hf_lightning.cli_data.EmbeddedClassificationData",
            "init_args": {"train_size": 48, "eval_size": 32, "test_size": 16, "seed": 3},
        },
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return str(path)


def test_validate_reports_the_checkpoint_epoch_and_keeps_fit_results(tmp_path, one_thread):
    config = _config(tmp_path)
    fitted = run(["fit", "--config", config])
    output_dir = tmp_path / "run"
    assert fitted.metrics["epoch"] == 2.0
    fit_files = {name: (output_dir / name).read_bytes() for name in ("eval_results.json", "all_results.json")}

    validated = run(["validate", "--config", config, "--ckpt_path", "last"])

    assert validated.metrics["epoch"] == 2.0  # the checkpoint's epoch, not a fresh trainer's 0
    assert validated.metrics["eval_loss"] == pytest.approx(fitted.metrics["eval_loss"], rel=1e-6)
    assert validated.trainer.state.log_history[-1]["step"] == 6  # 2 epochs of 3 steps
    for name, content in fit_files.items():
        assert (output_dir / name).read_bytes() == content, f"validate overwrote fit's {name}"
    saved = json.loads((output_dir / "validate_results.json").read_text())
    assert saved["epoch"] == 2.0 and saved["eval_loss"] == pytest.approx(validated.metrics["eval_loss"])
    assert str(output_dir / "validate_results.json") in validated.files
