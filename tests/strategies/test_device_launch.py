"""A plain `python script.py` with several GPUs becomes one process per GPU (docs/divergences.md)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hf_lightning.strategies.launch as device_launch
from hf_lightning.args.training_args import TrainingArguments

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "distributed" / "device_launch_script.py"
_LAUNCHER_VARIABLES = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def four_gpus(monkeypatch):
    for name in _LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(device_launch, "_interactive", lambda: False)


def test_a_script_seeing_four_gpus_launches_four_processes(four_gpus, tmp_path):
    assert device_launch.devices_to_launch(TrainingArguments(output_dir=str(tmp_path))) == 4


def test_no_launch_on_cpu_under_a_launcher_or_in_a_notebook(four_gpus, tmp_path, monkeypatch):
    assert device_launch.devices_to_launch(TrainingArguments(output_dir=str(tmp_path), use_cpu=True)) == 1
    monkeypatch.setattr(device_launch, "_interactive", lambda: True)
    assert device_launch.devices_to_launch(TrainingArguments(output_dir=str(tmp_path))) == 1
    monkeypatch.setattr(device_launch, "_interactive", lambda: False)
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert device_launch.devices_to_launch(TrainingArguments(output_dir=str(tmp_path))) == 1


def test_one_gpu_launches_nothing(four_gpus, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert device_launch.devices_to_launch(TrainingArguments(output_dir=str(tmp_path))) == 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_self_launched_ranks_train_as_a_torchrun_launch(tmp_path):
    clean_env = {k: v for k, v in __import__("os").environ.items() if k not in _LAUNCHER_VARIABLES}
    plain = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(tmp_path), "self"],
        cwd=ROOT,
        env=clean_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    torchrun = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            f"--master_port={_free_port()}",
            "--master_addr=127.0.0.1",
            str(SCRIPT),
            str(tmp_path),
            "torchrun",
        ],
        cwd=ROOT,
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output, _ = plain.communicate(timeout=600)
    assert torchrun.returncode == 0, torchrun.stderr[-4000:]
    # The plain command returns only once every rank is done.
    assert plain.returncode == 0, output[-4000:]
    runs = {
        (mode, rank): json.loads((tmp_path / f"{mode}_rank{rank}.json").read_text())
        for mode in ("self", "torchrun")
        for rank in (0, 1)
    }
    for (mode, rank), seen in runs.items():
        assert (seen["world_size"], seen["process_index"]) == (2, rank), mode
    ours, launched = runs[("self", 0)]["log_history"], runs[("torchrun", 0)]["log_history"]
    assert [e["step"] for e in ours] == [e["step"] for e in launched] == [1, 2, 3, 4, 4]
    for entry, reference in zip(ours[:-1], launched[:-1]):
        assert entry["loss"] == pytest.approx(reference["loss"], rel=1e-6)


def test_an_error_in_rank_zero_stops_the_other_ranks(tmp_path):
    """Rank 0 fails after the launch: the other rank, waiting for it, is stopped and the command fails fast."""
    script = tmp_path / "fails.py"
    script.write_text(
        "import os, sys, time\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from hf_lightning.strategies.launch import launch_over_devices\n"
        "launch_over_devices(2)\n"
        "if os.environ['RANK'] == '0':\n"
        "    raise RuntimeError('rank 0 failed')\n"
        "time.sleep(120)  # rank 1: stands for a collective that would wait for rank 0\n"
    )
    clean_env = {k: v for k, v in __import__("os").environ.items() if k not in _LAUNCHER_VARIABLES}
    completed = subprocess.run(
        [sys.executable, str(script)], env=clean_env, capture_output=True, text=True, timeout=60
    )
    assert completed.returncode != 0 and "rank 0 failed" in completed.stderr
