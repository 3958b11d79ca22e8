"""SFT on 2 gloo processes with hf_lightning.trl equals stock TRL's 2-process run."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trl import harness

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "distributed" / "trl_sft_script.py"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(side: str, out_dir: Path) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
        "--master_addr=127.0.0.1", str(SCRIPT), side, str(out_dir),
    ]
    completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads((out_dir / f"{side}.json").read_text()), load_file(str(out_dir / f"{side}.safetensors"))


@pytest.mark.slow
def test_two_process_sft_matches_stock_trl(tmp_path):
    stock, stock_weights = _launch("stock", tmp_path)
    ours, our_weights = _launch("ours", tmp_path)
    assert ours["world_size"] == stock["world_size"] == 2
    harness.assert_same_history(ours["log_history"], stock["log_history"])
    harness.assert_same_weights(our_weights, stock_weights)
    assert ours["checkpoints"] == stock["checkpoints"]
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(ours["checkpoints"]["checkpoint-2"])
