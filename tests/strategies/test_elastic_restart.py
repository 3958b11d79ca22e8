"""A job that torchrun's elastic agent restarts continues from its last complete checkpoint, exactly.

The literal `torchrun --nproc_per_node=2 --max-restarts=1` runs a script that calls `train()` without resuming
(tests/distributed/elastic_restart_script.py); rank 1 of the first attempt is killed after update 5. The restarted
workers build their process group over this attempt's own store entries (without them gloo dials the dead attempt's
ports), continue from checkpoint-4 and end with the uninterrupted run's weights, bit for bit; the restart is said
before training. With `HF_LIGHTNING_RESUME_ON_RESTART=0` the restart starts over, as the reference's does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed.launching import free_port

pytestmark = pytest.mark.slow  # three 2-process launches

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "distributed" / "elastic_restart_script.py"


def _torchrun(out_dir: Path, **env) -> subprocess.CompletedProcess:
    out_dir.mkdir(parents=True)
    environment = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    environment.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **env)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--max-restarts=1",
        f"--master_port={free_port()}", str(SCRIPT), str(out_dir),
    ]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600)


def _report(out_dir: Path, attempt: int, rank: int) -> dict:
    return json.loads((out_dir / f"attempt{attempt}_rank{rank}.json").read_text())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out_dir = tmp_path_factory.mktemp("elastic") / "uninterrupted"
    completed = _torchrun(out_dir)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return out_dir


def test_a_restarted_job_continues_from_its_last_checkpoint_bit_for_bit(uninterrupted, tmp_path):
    completed = _torchrun(tmp_path / "killed", KILL_AT_STEP="5")
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert "connectFullMesh" not in completed.stderr
    checkpoint = tmp_path / "killed" / "run" / "checkpoint-4"
    assert f"hf_lightning: restart 1 by torchrun's elastic agent: continuing from {checkpoint}" in completed.stderr
    for rank in (0, 1):
        expected, restarted = _report(uninterrupted, 0, rank), _report(tmp_path / "killed", 1, rank)
        assert restarted["global_step"] == expected["global_step"] == 12
        assert restarted["weights"] == expected["weights"], rank  # float lists: equal means bit for bit
        assert restarted["losses"] == expected["losses"]
        # Steps run over both attempts: the total plus those since the last checkpoint (5 - 4), at most.
        assert _report(tmp_path / "killed", 0, rank)["steps_run"] + restarted["steps_run"] <= 12 + 1 + (rank == 0)


def test_the_opt_out_starts_over_as_the_reference_does(tmp_path):
    completed = _torchrun(tmp_path / "over", KILL_AT_STEP="5", HF_LIGHTNING_RESUME_ON_RESTART="0")
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert "continuing from" not in completed.stderr
    assert _report(tmp_path / "over", 1, 0)["steps_run"] == 12  # every step again
