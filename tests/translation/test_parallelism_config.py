"""parallelism_config (accelerate's ParallelismConfig) in the translation: dp_shard_size becomes FSDP2 on
ModelParallelStrategy's mesh, explain() says how each size maps onto the mesh, and sizes hf_lightning cannot
run are refused before training, naming the field. The 2-process run itself is in
tests/strategies/test_fsdp_cpu.py (`bert_dp_shard`)."""

from __future__ import annotations

import pytest
from accelerate.parallelism_config import ParallelismConfig

from hf_lightning import Trainer, TrainingArguments
from hf_lightning.translation.environment import Environment
from hf_lightning.translation.translate import explain, translate
from tests.parity.models import make_regression_mlp, regression_data

TWO_PROCESSES = Environment(world_size=2, local_world_size=2, is_distributed_launch=True)
TWO_NODES = Environment(world_size=2, local_world_size=1, num_nodes=2, is_distributed_launch=True)


def _args(config: ParallelismConfig, **extra) -> TrainingArguments:
    return TrainingArguments(
        output_dir="unused", use_cpu=True, report_to="none", parallelism_config=config, **extra
    )


@pytest.mark.parametrize("env", [TWO_PROCESSES, TWO_NODES], ids=["one_node", "two_nodes"])
def test_dp_shard_runs_as_fsdp2_on_the_mesh(env):
    plan = translate(_args(ParallelismConfig(dp_shard_size=2)), env=env)
    assert plan.strategy.name == "fsdp2"
    assert plan.strategy.fsdp.version == 2
    assert plan.strategy.fsdp.state_dict_type == "FULL_STATE_DICT"
    assert (plan.lightning.devices, plan.lightning.num_nodes) == (env.local_world_size, env.num_nodes)
    text = explain(plan)
    assert "parallelism_config" in text
    assert "data_parallel=2 (dp_shard_size" in text
    assert "tensor_parallel=1 (tp_size)" in text


def test_dp_shard_takes_fsdp_config_options():
    args = _args(
        ParallelismConfig(dp_shard_size=2),
        fsdp="full_shard",
        fsdp_config={"state_dict_type": "SHARDED_STATE_DICT"},
    )
    plan = translate(args, env=TWO_PROCESSES)
    assert plan.strategy.name == "fsdp2"
    assert plan.strategy.fsdp.state_dict_type == "SHARDED_STATE_DICT"


def test_every_size_one_leaves_the_run_as_without_it():
    plan = translate(_args(ParallelismConfig()), env=TWO_PROCESSES)
    assert plan.strategy.name == "ddp"
    assert plan.notes["parallelism_config"].status == "not-applicable"


@pytest.mark.parametrize(
    ("config", "env", "extra", "expected"),
    [
        (
            ParallelismConfig(dp_shard_size=4),
            TWO_PROCESSES,
            {},
            "= 4 processes, but the launch has world_size=2",
        ),
        (ParallelismConfig(dp_shard_size=2), Environment(), {}, "but the launch has world_size=1"),
        (ParallelismConfig(tp_size=2), TWO_PROCESSES, {}, "parallelism_config.tp_size=2: tensor parallelism"),
        (
            ParallelismConfig(cp_size=2),
            TWO_PROCESSES,
            {},
            "parallelism_config.cp_size=2: context parallelism",
        ),
        (ParallelismConfig(dp_replicate_size=2), TWO_PROCESSES, {}, "parallelism_config.dp_replicate_size=2"),
        (
            ParallelismConfig(dp_shard_size=2),
            TWO_PROCESSES,
            {"fsdp": "full_shard", "fsdp_config": {"version": 1}},
            "set fsdp_config['version']=2",
        ),
    ],
    ids=["product", "not_launched", "tp", "cp", "replicate", "fsdp1"],
)
def test_impossible_sizes_are_refused_naming_the_field(config, env, extra, expected):
    with pytest.raises(ValueError, match="parallelism_config") as error:
        translate(_args(config, **extra), env=env)
    assert expected in str(error.value)


def test_refused_before_training(tmp_path):
    args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        parallelism_config=ParallelismConfig(tp_size=2),
    )
    with pytest.raises(ValueError, match="parallelism_config.tp_size=2"):
        Trainer(model=make_regression_mlp(), args=args, train_dataset=regression_data()).train()
    assert not any(tmp_path.iterdir())  # nothing written: refused before the run started
