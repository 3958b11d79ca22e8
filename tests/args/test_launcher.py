"""The process layout read from the launcher: torchrun's variables first, else SLURM's (as Lightning's
SLURMEnvironment reads them), and what the arguments and the translation see under each."""

from __future__ import annotations

import pytest

from hf_lightning import TrainingArguments
from hf_lightning.args.launcher import launch_layout
from hf_lightning.translation.environment import Environment
from hf_lightning.translation.translate import translate

_LAUNCH = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
SRUN_TASK_3 = {  # srun --nodes 2 --ntasks-per-node 2: the second task of node 1
    "SLURM_NTASKS": "4",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_NNODES": "2",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NAME": "train",
}


@pytest.fixture
def clean_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name in _LAUNCH or name.startswith("SLURM_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_srun_task_layout(clean_env):
    for name, value in SRUN_TASK_3.items():
        clean_env.setenv(name, value)
    layout = launch_layout()
    assert (layout.world_size, layout.rank, layout.local_rank, layout.local_world_size) == (4, 3, 1, 2)
    assert (layout.num_nodes, layout.node_rank, layout.source) == (2, 1, "slurm")
    args = TrainingArguments(output_dir="unused", use_cpu=True, report_to="none", save_on_each_node=True)
    assert (args.world_size, args.process_index, args.local_process_index) == (4, 3, 1)
    assert args.parallel_mode.value == "distributed"
    assert not args.should_save and not args.should_log  # local rank 1: neither node-scoped nor global main
    plan = translate(args, env=Environment.detect())
    assert (plan.lightning.devices, plan.lightning.num_nodes, plan.strategy.name) == (2, 2, "ddp")


def test_torchrun_variables_win_over_slurm(clean_env):
    for name, value in {
        **SRUN_TASK_3,
        "WORLD_SIZE": "2",
        "RANK": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
    }.items():
        clean_env.setenv(name, value)
    layout = launch_layout()
    assert (layout.source, layout.world_size, layout.rank, layout.num_nodes) == ("torchrun", 2, 1, 2)


@pytest.mark.parametrize(
    "overrides", [{"SLURM_JOB_NAME": "interactive"}, {"SLURM_JOB_NAME": "bash"}, {"SLURM_NTASKS": "1"}]
)
def test_slurm_without_a_multi_task_srun_is_one_process(clean_env, overrides):
    for name, value in {**SRUN_TASK_3, **overrides}.items():
        clean_env.setenv(name, value)
    assert launch_layout() is None
    args = TrainingArguments(output_dir="unused", use_cpu=True, report_to="none")
    assert (args.world_size, args.process_index) == (1, 0)


# Ray Train's TorchConfig (ray/train/torch/config.py) sets these from ray.train.get_context() on each worker; here
# node 0 holds ranks 0 and 1, node 1 holds rank 2 alone.
RAY_UNEVEN_NODES = [
    {"WORLD_SIZE": "3", "RANK": str(rank), "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": str(size),
     "NODE_RANK": str(node)}
    for rank, local, size, node in ((0, 0, 2, 0), (1, 1, 2, 0), (2, 0, 1, 1))
]
_PROPERTIES = """
seen = {}
for each_node in (False, True):
    args = TrainingArguments(output_dir=output_dir, use_cpu=True, report_to="none", save_on_each_node=each_node,
                             log_on_each_node=each_node)
    seen[str(each_node)] = [args.world_size, args.process_index, args.local_process_index, args.should_save,
                            args.should_log, args.distributed_state.is_local_main_process,
                            args.distributed_state.is_main_process]
"""
_REFERENCE = (
    "import json, sys\nfrom transformers import TrainingArguments\noutput_dir = sys.argv[1]\n"
    + _PROPERTIES + "print('PROPERTIES ' + json.dumps(seen))\n"
)


def test_nodes_holding_different_worker_counts_are_described_as_the_reference(clean_env, tmp_path):
    """Each of three Ray Train workers on two uneven nodes (2 + 1): our arguments' ranks and node-scoped
    properties (save / log on each node, local main process) equal the reference's under the same variables (three
    reference processes joined in one gloo group, as accelerate's state needs), and the layout's node is Ray's."""
    import json
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = {k: v for k, v in os.environ.items() if k not in _LAUNCH and not k.startswith("SLURM_")}
    reference = [
        subprocess.Popen(
            [sys.executable, "-c", _REFERENCE, str(tmp_path)], stdout=subprocess.PIPE, text=True,
            env={**base, **variables, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
        )
        for variables in RAY_UNEVEN_NODES
    ]
    outputs = [process.communicate(timeout=120)[0] for process in reference]
    assert [process.returncode for process in reference] == [0, 0, 0], outputs
    expected = [json.loads(out.split("PROPERTIES ", 1)[1]) for out in outputs]
    from hf_lightning import TrainingArguments
    for variables, reference_seen in zip(RAY_UNEVEN_NODES, expected):
        for name, value in variables.items():
            clean_env.setenv(name, value)
        layout = launch_layout()
        assert layout.node_rank == int(variables["NODE_RANK"])  # rank // local_world_size would say 2 for rank 2
        namespace = {"TrainingArguments": TrainingArguments, "output_dir": str(tmp_path)}
        exec(_PROPERTIES, namespace)  # the same statements as the reference's processes, on our arguments
        assert namespace["seen"] == reference_seen, variables
    # save_on_each_node: the lone worker of node 1 writes its node's copy
    assert [seen["True"][3] for seen in expected] == [True, False, True]
