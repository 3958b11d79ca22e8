"""output_dir that is a file is a clear error; saved weights get the mode of the other files (the umask's)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from hf_lightning.args.training_args import TrainingArguments
from hf_lightning.cli.data_sources import CLI_VOCAB_SIZE
from hf_lightning.cli.lightning_cli import main
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.models import LinearRegressor


def test_output_dir_that_is_a_file_names_output_dir(tmp_path):
    existing = tmp_path / "results"
    existing.write_text("not a folder")
    args = TrainingArguments(output_dir=str(existing), report_to="none", use_cpu=True)
    with pytest.raises(ValueError, match=r"output_dir=.*results.* is an existing file, not a folder"):
        HFLightningTrainer(model=LinearRegressor(2), args=args)


def test_the_cli_reports_an_output_dir_file_in_one_line(tmp_path, capsys):
    existing = tmp_path / "results"
    existing.write_text("not a folder")
    config = {
        "args": {"output_dir": str(existing), "report_to": "none", "use_cpu": True},
        "model": {
            "class_path": "hf_lightning.cli.embedded.TinyTransformerClassifier",
            "init_args": {
                "vocab_size": CLI_VOCAB_SIZE,
                "d_model": 16,
                "dim_feedforward": 32,
                "num_layers": 1,
            },
        },
        "data": {
            "class_path": "hf_lightning.cli_data.EmbeddedClassificationData",
            "init_args": {"train_size": 8},
        },
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    assert main(["validate", "--config", str(path)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("hf-lightning validate: error: output_dir=") and len(error.splitlines()) == 1, (
        error
    )


def test_saved_weights_follow_the_umask_like_the_other_files(tmp_path):
    previous = os.umask(0o022)
    try:
        args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True)
        HFLightningTrainer(model=LinearRegressor(2), args=args).save_model()
    finally:
        os.umask(previous)
    out = Path(args.output_dir)
    modes = {
        name: stat.S_IMODE((out / name).stat().st_mode) for name in ("model.safetensors", "training_args.bin")
    }
    assert modes == {"model.safetensors": 0o644, "training_args.bin": 0o644}
