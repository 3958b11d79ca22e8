"""Two `srun` tasks on this host (SLURM_* variables, Lightning's SLURMEnvironment with auto-requeue, gloo): the
scheduler's warning signal (SIGUSR1) reaching one task stops both at one update boundary with one complete
checkpoint, the job is requeued once, both tasks end by the signal (as the reference's processes do), and the
requeued job (SLURM_RESTART_COUNT=1, the same script) ends with the uninterrupted job's weights, bit for bit."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hf_lightning.checkpoint.files import checkpoint_problem, list_checkpoints
from tests.strategies.test_multinode import _clean_env, _port_is_free

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "distributed" / "slurm_requeue_script.py"
TIMEOUT_S = 300  # a bound far above a normal run (about 10 s), far below the gloo timeout's 30 minutes

pytestmark = pytest.mark.slow


def _srun(out_dir: Path, bin_dir: Path, **extra: str) -> list[subprocess.CompletedProcess]:
    job_id = next(j for j in random.sample(range(1000, 10000), 200) if _port_is_free(15000 + j))
    processes = []
    for task in (0, 1):
        env = {
            **_clean_env(),
            "SLURM_JOB_ID": str(job_id), "SLURM_JOB_NAME": "train", "SLURM_NTASKS": "2",
            "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1",
            "SLURM_NODELIST": "127.0.0.1", "SLURM_PROCID": str(task), "SLURM_LOCALID": str(task),
            "SLURM_NODEID": "0", "PATH": f"{bin_dir}:{os.environ['PATH']}", **extra,
        }
        processes.append(subprocess.Popen(
            [sys.executable, str(SCRIPT), str(out_dir)], cwd=ROOT, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))
    try:
        outputs = [process.communicate(timeout=TIMEOUT_S) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    return [
        subprocess.CompletedProcess(process.args, process.returncode, out, err)
        for process, (out, err) in zip(processes, outputs)
    ]


def _weights(out_dir: Path) -> list[dict]:
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def test_requeue_signal_to_one_task_stops_both_requeues_once_and_the_job_continues_exactly(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol-calls.txt"
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    (bin_dir / "scontrol").chmod(0o755)

    straight = tmp_path / "straight"
    for completed in _srun(straight, bin_dir):
        assert completed.returncode == 0, completed.stderr[-4000:]

    job = tmp_path / "job"
    stopped = _srun(job, bin_dir, REQUEUE_SIGNAL_AT="1")
    for completed in stopped:  # each task ends by the signal (a shell reports 138)
        assert completed.returncode == -signal.SIGUSR1, completed.stderr[-4000:]
        assert "Traceback" not in completed.stderr, completed.stderr[-4000:]
    assert len(calls.read_text().splitlines()) == 1 and calls.read_text().split()[0] == "requeue"
    checkpoints = list_checkpoints(str(job / "run"))
    assert [step for step, _ in checkpoints] == [3]  # the update boundary after the signal; save_strategy="no"
    assert checkpoint_problem(checkpoints[0][1]) is None
    assert not [name for name in os.listdir(job / "run") if name.startswith("hpc_ckpt_")]

    requeued = _srun(job, bin_dir, SLURM_RESTART_COUNT="1")
    for completed in requeued:
        assert completed.returncode == 0, completed.stderr[-4000:]
    assert "restart 1 by a SLURM requeue: continuing from" in requeued[0].stderr
    for ours, reference in zip(_weights(job), _weights(straight)):
        assert ours == reference  # global step 8 and every weight, bit for bit (JSON floats round-trip exactly)
