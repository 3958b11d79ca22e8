"""`hf-lightning explain args.json --accelerator gpu --devices 8 --num_nodes 2` previews a GPU run's translation on
a CPU machine: the arguments are checked and translated for the target, not for this machine."""

from __future__ import annotations

import json

import pytest
import torch

from hf_lightning.args.reference_rules import _bf16_accelerator_available
from hf_lightning.cli.main import main
from hf_lightning.translation.environment import Environment

GPU_RUN = {"output_dir": "out", "bf16": True, "tf32": True, "per_device_train_batch_size": 4}


@pytest.fixture
def args_json(tmp_path):
    path = tmp_path / "args.json"
    path.write_text(json.dumps(GPU_RUN), encoding="utf-8")
    return str(path)


def _row(out: str, field: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(field + " "))


def test_a_bf16_run_is_refused_for_this_cpu_machine_and_says_how_to_preview_it(args_json, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this machine: a CPU one (as in CI)
    assert main(["explain", args_json]) == 2
    error = capsys.readouterr().err
    assert "bf16" in error and "--accelerator gpu" in error


def test_a_gpu_run_translates_for_the_target_machine(args_json, capsys):
    precision = torch.backends.fp32_precision
    assert main(["explain", args_json, "--accelerator", "gpu", "--devices", "8", "--num_nodes", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Target machine: 8 gpu process(es) per node x 2 node(s) (world size 16)")
    assert "accelerator='gpu', devices=8, num_nodes=2" in _row(out, "use_cpu")
    assert "honoured" in _row(out, "bf16") and "honoured" in _row(out, "tf32")
    # This machine's TF32 is left as it was (tf32=True was checked for the target), and its checks are its own again.
    assert torch.backends.fp32_precision == precision
    assert _bf16_accelerator_available() is bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def test_a_cpu_target_with_several_processes(tmp_path, capsys):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"output_dir": "out", "use_cpu": True}), encoding="utf-8")
    assert main(["explain", str(path), "--accelerator", "cpu", "--devices", "2"]) == 0
    out = capsys.readouterr().out
    assert "world size 2" in out and "devices=2" in _row(out, "use_cpu")


def test_the_target_environment():
    env = Environment.for_target("gpu", devices=4, num_nodes=2)
    assert (env.cuda_available, env.cuda_device_count, env.world_size, env.local_world_size, env.num_nodes) == (
        True, 4, 8, 4, 2,
    )  # fmt: skip
    assert env.is_distributed_launch and not env.mps_available
    with pytest.raises(ValueError, match="accelerator='tpu'"):
        Environment.for_target("tpu")


def test_a_checkpoints_training_args_bin_is_explained(tmp_path, capsys):
    """The file we write into every checkpoint (a plain, token-free dict) explains like a JSON file."""
    from hf_lightning import Trainer, TrainingArguments
    from tests.models import make_regression_mlp, regression_data

    args = TrainingArguments(
        output_dir=str(tmp_path / "run"), use_cpu=True, report_to="none", disable_tqdm=True, max_steps=1,
        save_steps=1, per_device_train_batch_size=2, learning_rate=3e-3, hub_token="hf_secret",
    )  # fmt: skip
    Trainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(4)).train()
    capsys.readouterr()
    assert main(["explain", str(tmp_path / "run" / "checkpoint-1" / "training_args.bin")]) == 0
    out = capsys.readouterr().out
    assert "learning_rate" in _row(out, "learning_rate") and "hf_secret" not in out


def test_the_references_pickled_training_args_bin_is_refused_without_unpickling(tmp_path, capsys):
    import transformers

    path = tmp_path / "training_args.bin"
    torch.save(transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none"), path)
    assert main(["explain", str(path)]) == 2
    error = capsys.readouterr().err
    assert "pickled TrainingArguments" in error and "to_json_string" in error and "UnicodeDecodeError" not in error
    assert "remove it" not in error  # the file is the run's record: the advice is to export its fields, not delete it


def test_a_damaged_training_args_bin_is_named_as_unreadable(tmp_path, capsys):
    path = tmp_path / "training_args.bin"
    path.write_bytes(b"PK\x03\x04 not a zip archive")
    assert main(["explain", str(path)]) == 2
    error = capsys.readouterr().err
    assert "training_args.bin that can be read" in error and "damaged" in error and "pickled" not in error


def test_a_misspelt_field_gets_no_hint_about_another_machine(tmp_path, capsys):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"output_dir": "out", "learning_rte": 1e-3}), encoding="utf-8")
    assert main(["explain", str(path)]) == 2
    error = capsys.readouterr().err
    assert "learning_rte" in error and "another machine" not in error
