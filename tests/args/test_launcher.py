"""The process layout read from the launcher: torchrun's variables first, else SLURM's (as Lightning's
SLURMEnvironment reads them), and what the arguments and the translation see under each."""

from __future__ import annotations

import pytest

from hf_lightning import TrainingArguments
from hf_lightning.args.launcher import launch_layout
from hf_lightning.translation.environment import Environment
from hf_lightning.translation.translate import translate

_LAUNCH = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
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
