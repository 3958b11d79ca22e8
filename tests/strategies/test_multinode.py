"""Two nodes x one process on this host (CPU, gloo): two torchrun agents meeting at a c10d rendezvous, and the
same run as two `srun` tasks (SLURM_* variables set here, Lightning's SLURMEnvironment), match the reference's
two-agent torchrun launch: log history, weights, each node's checkpoint files (the per-rank RNG files, the
node-scoped `save_on_each_node`), `should_log` / `should_save` and `main_process_first(local=...)`.

Two steps, a checkpoint after each. With one process per node every process is local rank 0 of its node, so the node-scoped flags are true on
both processes and the global ones on rank 0 only.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "distributed" / "multinode_train_script.py"
MARKER = "hf_lightning_complete.json"
_LAUNCH_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _clean_env() -> dict[str, str]:
    return {
        key: value
        for key, value in os.environ.items()
        if key not in _LAUNCH_VARIABLES and not key.startswith("SLURM_")
    }


def _wait(processes: list[subprocess.Popen]) -> None:
    try:
        outputs = [process.communicate(timeout=600) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    for process, (_, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr[-4000:]


def _read(side: str, out_dir: Path) -> list[dict]:
    return [json.loads((out_dir / f"{side}_{rank}.json").read_text()) for rank in (0, 1)]


def _torchrun_agents(side: str, out_dir: Path) -> list[dict]:
    """Two torchrun agents, one per simulated node, meeting at a c10d rendezvous on this host."""
    endpoint = f"127.0.0.1:{_free_port()}"
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc_per_node=1",
                f"--node_rank={node}",
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint={endpoint}",
                "--rdzv_id=multinode",
                str(SCRIPT),
                side,
                str(out_dir),
            ],
            cwd=ROOT,
            env=_clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in (0, 1)
    ]
    _wait(processes)
    return _read(side, out_dir)


def _srun_tasks(side: str, out_dir: Path, scenario: str) -> list[dict]:
    """What `srun --nodes=2 --ntasks-per-node=1` starts: one task per node, no torchrun variables; the address
    comes from SLURM_NODELIST and the port from SLURM_JOB_ID, as Lightning's SLURMEnvironment derives them."""
    job_id = next(j for j in random.sample(range(1000, 10000), 200) if _port_is_free(15000 + j))
    processes = []
    for task in (0, 1):
        env = {
            **_clean_env(),
            "SLURM_JOB_ID": str(job_id),
            "SLURM_JOB_NAME": "train",
            "SLURM_NTASKS": "2",
            "SLURM_NTASKS_PER_NODE": "1",
            "SLURM_NNODES": "2",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_NODELIST": "127.0.0.1",
            "SLURM_PROCID": str(task),
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": str(task),
        }
        processes.append(
            subprocess.Popen(
                [sys.executable, str(SCRIPT), side, str(out_dir), scenario],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    _wait(processes)
    return _read(side, out_dir)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    reference = _torchrun_agents("ref", tmp_path_factory.mktemp("ref"))
    return {
        "ref": reference,
        "torchrun": _torchrun_agents("ours", tmp_path_factory.mktemp("torchrun")),
        # The SLURM launch runs one scenario (CI time): save_on_each_node, the one node 1 writes most for.
        "slurm": _srun_tasks("ours", tmp_path_factory.mktemp("slurm"), "each_node"),
    }


def _assert_same_history(ours: list[dict], reference: list[dict], name: str) -> None:
    assert [e["step"] for e in ours] == [e["step"] for e in reference], name
    for our_entry, ref_entry in zip(ours, reference):
        assert list(our_entry) == list(ref_entry), name
        assert our_entry["epoch"] == ref_entry["epoch"], name
        for key in ("loss", "grad_norm", "learning_rate", "train_loss"):
            if key in ref_entry:
                assert our_entry[key] == pytest.approx(ref_entry[key], rel=1e-5, abs=1e-7), (name, key)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("launch", "name"), [("torchrun", "defaults"), ("torchrun", "each_node"), ("slurm", "each_node")]
)
def test_two_node_run_matches_the_reference(runs, launch, name):
    reference, ours = runs["ref"], runs[launch]
    expected_cluster = {"torchrun": "TorchElasticEnvironment", "slurm": "SLURMEnvironment"}[launch]
    for rank in (0, 1):
        ref_rank, our_rank = reference[rank][name], ours[rank][name]
        assert our_rank["cluster"] == expected_cluster
        assert our_rank["layout"] == ref_rank["layout"] == [2, rank, 0]
        assert our_rank["flags"] == ref_rank["flags"], (name, rank)
        assert (
            our_rank["main_process_first"]
            == ref_rank["main_process_first"]
            == {"local": True, "global": True}
        )
        _assert_same_history(our_rank["log_history"], ref_rank["log_history"], name)
        for key, values in ref_rank["weights"].items():
            assert our_rank["weights"][key] == pytest.approx(values, rel=1e-4, abs=1e-6), (name, key)
        # Each node's folder: the same checkpoint files (ours adds the atomic save's completion marker).
        ours_folders, reference_folders = our_rank["checkpoints"], ref_rank["checkpoints"]
        assert list(ours_folders) == list(reference_folders) == ["checkpoint-1", "checkpoint-2"], (name, rank)
        for folder, files in reference_folders.items():
            assert [f for f in ours_folders[folder] if f != MARKER] == files, (name, rank, folder)


@pytest.mark.slow
def test_node_scoped_meanings(runs):
    """What the reference does, spelled out: node-scoped flags hold on both nodes, global ones on rank 0."""
    for launch in ("ref", "torchrun"):
        nodes = runs[launch]
        defaults = [nodes[rank]["defaults"] for rank in (0, 1)]
        each_node = [nodes[rank]["each_node"] for rank in (0, 1)]
        assert [d["flags"]["should_log"] for d in defaults] == [True, True], launch
        assert [d["flags"]["should_save"] for d in defaults] == [True, False], launch
        assert [d["flags"]["should_log"] for d in each_node] == [True, False], launch
        assert [d["flags"]["should_save"] for d in each_node] == [True, True], launch
        assert [d["flags"]["is_local_process_zero"] for d in defaults] == [True, True], launch
        assert [d["flags"]["is_world_process_zero"] for d in defaults] == [True, False], launch
        # Node 1 saves only its RNG file unless save_on_each_node; the weights go to every saving node.
        assert defaults[1]["checkpoints"]["checkpoint-1"] == ["rng_state_1.pth"], launch
        assert "rng_state_0.pth" in defaults[0]["checkpoints"]["checkpoint-1"], launch
        # save_on_each_node: node 1 writes the optimizer, scheduler, state and arguments, but the reference's
        # save_pretrained writes weights and config on global rank 0 only, so node 1 has none (reproduced).
        assert [f for f in each_node[1]["checkpoints"]["checkpoint-1"] if f != MARKER] == [
            "optimizer.pt",
            "rng_state_1.pth",
            "scheduler.pt",
            "trainer_state.json",
            "training_args.bin",
        ], launch
