"""Nodes holding different process counts: two torchrun agents on this host, one with two processes and one with
one (`--nproc_per_node=2` / `=1`, a c10d rendezvous), train ours and the reference with the same script. Lightning's
`devices x num_nodes` cannot describe 2 + 1; each process is described by the launcher's values
(strategies/uneven_nodes.py) and the run equals the reference's: world size 3, each process's global / local / node
rank, the data read 3 ways, losses and final weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lightning.fabric.plugins.environments import LightningEnvironment

from hf_lightning import TrainingArguments
from hf_lightning.args.launcher import launch_layout
from hf_lightning.engine.lightning_bridge import _describe_uneven_nodes
from hf_lightning.strategies.build import build_strategy
from hf_lightning.strategies.uneven_nodes import LaunchedProcessEnvironment, environment_for_layout
from hf_lightning.translation.environment import Environment
from hf_lightning.translation.translate import translate
from tests.distributed.launching import free_port
from tests.models import make_tiny_gpt2

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "distributed" / "uneven_nodes_script.py"
# (node, processes on it): node 0 holds global ranks 0 and 1, node 1 holds rank 2.
NODES = ((0, 2), (1, 1))


def _agents(side: str, out_dir: Path) -> list[dict]:
    environment = {
        k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")
    }
    environment.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    endpoint = f"127.0.0.1:{free_port()}"
    agents = [
        subprocess.Popen(
            [
                sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--nproc_per_node={count}",
                f"--node_rank={node}", "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}", "--rdzv_id=uneven",
                str(SCRIPT), side, str(out_dir),
            ],
            cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for node, count in NODES
    ]
    try:
        outputs = [agent.communicate(timeout=300) for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
    for agent, (_, stderr) in zip(agents, outputs):
        assert agent.returncode == 0, stderr[-4000:]
    return [json.loads((out_dir / f"{side}_{rank}.json").read_text()) for rank in range(3)]


@pytest.mark.slow
def test_two_plus_one_processes_train_as_the_reference(tmp_path):
    reference = _agents("ref", tmp_path / "ref")
    ours = _agents("ours", tmp_path / "ours")
    # (world size, global rank, local rank, node rank) of each process, as the launcher numbered them.
    expected = [[3, 0, 0, 0], [3, 1, 1, 0], [3, 2, 0, 1]]
    for rank in range(3):
        assert ours[rank]["lightning"] == expected[rank]
        assert ours[rank]["layout"] == reference[rank]["layout"] == [3, *expected[rank][1:3], 3]
        # The data read 3 ways: each process the reference's rows, in its order. Ours first looks at row 0 before
        # training (the inspection of the first item), hence the rows compared from the end.
        our_rows, ref_rows = ours[rank]["read"], reference[rank]["read"]
        assert our_rows[len(our_rows) - len(ref_rows) :] == ref_rows, rank
        assert set(our_rows[: len(our_rows) - len(ref_rows)]) <= {0}, rank
        assert [e["step"] for e in ours[rank]["log_history"]] == [e["step"] for e in reference[rank]["log_history"]]
        for our_entry, ref_entry in zip(ours[rank]["log_history"], reference[rank]["log_history"]):
            if "loss" in ref_entry:
                assert our_entry["loss"] == pytest.approx(ref_entry["loss"], rel=1e-5), rank
        for key, values in reference[rank]["weights"].items():
            assert ours[rank]["weights"][key] == pytest.approx(values, rel=1e-5, abs=1e-7), (rank, key)
    rows = [set(reference[rank]["read"][:2]) for rank in range(3)]  # the first step's 2 rows on each process
    assert len(rows[0] | rows[1] | rows[2]) == 6


def _launched(world: int, rank: int, local_rank: int, local_world: int, node: int):
    return launch_layout(
        {
            "WORLD_SIZE": str(world),
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_world),
            "GROUP_RANK": str(node),
        }
    )


@pytest.mark.parametrize(
    ("world", "rank", "local_rank", "local_world", "node", "num_nodes"),
    [(3, 0, 0, 2, 0, 1), (3, 1, 1, 2, 0, 1), (3, 2, 0, 1, 1, 3), (6, 2, 1, 2, 1, 3)],
)
def test_a_process_the_product_cannot_describe_gets_the_launchers_values(
    world, rank, local_rank, local_world, node, num_nodes
):
    """Nodes of 2 + 1 (and the middle node of 1 + 2 + 3, whose product is right but whose rank is not)."""
    layout = _launched(world, rank, local_rank, local_world, node)
    environment = environment_for_layout(layout, local_world, num_nodes)
    assert isinstance(environment, LaunchedProcessEnvironment)
    assert (environment.world_size(), environment.global_rank()) == (world, rank)
    assert (environment.local_rank(), environment.node_rank()) == (local_rank, node)
    environment.set_world_size(local_world * num_nodes)  # what Lightning's DDP calls: ignored
    environment.set_global_rank(node * local_world + local_rank)
    assert (environment.world_size(), environment.global_rank()) == (world, rank)
    environment.validate_settings(num_devices=local_world, num_nodes=num_nodes)
    with pytest.raises(ValueError, match=r"devices=5, but the launcher started \d process\(es\) on this node"):
        environment.validate_settings(num_devices=5, num_nodes=num_nodes)


def test_even_nodes_and_srun_keep_lightnings_own_environment():
    assert environment_for_layout(_launched(4, 3, 1, 2, 1), 2, 2) is None
    assert environment_for_layout(None, 1, 1) is None
    slurm = launch_layout(
        {"SLURM_NTASKS": "3", "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_NNODES": "2"}
    )
    assert environment_for_layout(slurm, 1, 3) is None


def _node_zero_of_two_plus_one(monkeypatch) -> Environment:
    """Rank 1 of 2 + 1 processes: the launcher's variables and the environment `Environment.detect` reads."""
    for name, value in {"WORLD_SIZE": "3", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GROUP_RANK", "0")
    return Environment(world_size=3, local_world_size=2, num_nodes=1, process_index=1, is_distributed_launch=True)


def test_fsdp2_shards_over_every_process_of_uneven_nodes(tmp_path, monkeypatch):
    environment = _node_zero_of_two_plus_one(monkeypatch)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", fsdp="full_shard")
    strategy = build_strategy(translate(args, environment), make_tiny_gpt2())
    assert strategy._data_parallel_size == 3  # not this node's 2 x Lightning's num_nodes 1


def test_hybrid_sharding_on_uneven_nodes_is_refused_naming_the_fix(tmp_path, monkeypatch):
    environment = _node_zero_of_two_plus_one(monkeypatch)
    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", fsdp="hybrid_shard", fsdp_config={"version": 1}
    )
    with pytest.raises(ValueError, match=r"HYBRID_SHARD: the nodes hold different process counts.*FULL_SHARD"):
        build_strategy(translate(args, environment), make_tiny_gpt2())


def test_the_lightning_trainer_gets_the_launchers_description_unless_the_user_gave_one(monkeypatch):
    _node_zero_of_two_plus_one(monkeypatch)
    kwargs = {"devices": 2, "num_nodes": 1}
    _describe_uneven_nodes(kwargs)
    assert [type(p) for p in kwargs["plugins"]] == [LaunchedProcessEnvironment]
    assert kwargs["plugins"][0].global_rank() == 1 and kwargs["plugins"][0].world_size() == 3
    users = LightningEnvironment()
    kwargs = {"devices": 2, "num_nodes": 1, "plugins": [users]}
    _describe_uneven_nodes(kwargs)
    assert kwargs["plugins"] == [users]
