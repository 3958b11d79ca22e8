"""Resize after a loss: `torchrun --nnodes=1:2` elastic membership, two simulated nodes (one agent and one process
each, a c10d rendezvous on this host). The second node is lost after update 5 (its worker kills its agent, then
itself); the surviving agent restarts with one node, and the plain script (`train()` without resuming,
`HF_LIGHTNING_KEEP_GLOBAL_BATCH=1`) continues from checkpoint-4 on one process through the resharding path, its
gradient accumulation doubled to keep the global batch, and ends with the uninterrupted two-node run's weights and
losses (to 1e-6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.distributed.launching import free_port

pytestmark = pytest.mark.slow  # two launches of two agents, one with an elastic restart

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "distributed" / "elastic_resize_script.py"


def _two_agents(out_dir: Path, **env: str) -> list[subprocess.CompletedProcess]:
    out_dir.mkdir(parents=True)
    environment = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    environment.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HF_LIGHTNING_KEEP_GLOBAL_BATCH="1", **env)
    endpoint = f"127.0.0.1:{free_port()}"
    agents = [
        subprocess.Popen(
            [
                sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc_per_node=1",
                "--max-restarts=1", "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}", "--rdzv_id=resize",
                # The first agent hosts the rendezvous store (it survives); a round closes 5 s after its minimum.
                f"--rdzv_conf=is_host={int(node == 0)},last_call_timeout=5", str(SCRIPT), str(out_dir),
            ],
            cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for node in (0, 1)
    ]
    try:
        outputs = [agent.communicate(timeout=300) for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
    return [subprocess.CompletedProcess(a.args, a.returncode, out, err) for a, (out, err) in zip(agents, outputs)]


def _report(out_dir: Path, attempt: int, rank: int) -> dict:
    return json.loads((out_dir / f"attempt{attempt}_rank{rank}.json").read_text())


def test_a_job_that_loses_a_node_continues_on_the_rest_with_the_global_batch_kept(tmp_path):
    for agent in _two_agents(tmp_path / "straight"):
        assert agent.returncode == 0, agent.stderr[-4000:]
    straight = _report(tmp_path / "straight", 0, 0)
    assert straight["world_size"] == 2 and straight["global_step"] == 12

    survivor, lost = _two_agents(tmp_path / "lost", LOSE_NODE_AT_STEP="5")
    assert lost.returncode != 0  # killed with its node
    assert survivor.returncode == 0, survivor.stderr[-4000:]
    checkpoint = tmp_path / "lost" / "run" / "checkpoint-4"
    assert f"hf_lightning: restart 1 by torchrun's elastic agent: continuing from {checkpoint}" in survivor.stderr
    assert "HF_LIGHTNING_KEEP_GLOBAL_BATCH=1: gradient_accumulation_steps 1 -> 2" in survivor.stderr
    resized = _report(tmp_path / "lost", 1, 0)
    assert resized["world_size"] == 1 and resized["gradient_accumulation_steps"] == 2
    assert resized["global_step"] == 12
    # The steps run across both attempts: the total plus those since the last checkpoint (5 - 4).
    assert _report(tmp_path / "lost", 0, 0)["steps_run"] + resized["steps_run"] <= 12 + 1
    for step in map(str, range(5, 13)):
        assert resized["losses"][step] == pytest.approx(straight["losses"][step], rel=1e-6, abs=1e-7), step
    for name, value in straight["weights"].items():
        torch.testing.assert_close(torch.tensor(resized["weights"][name]), torch.tensor(value), rtol=1e-6, atol=1e-6)
