"""parallelism_config (accelerate's ParallelismConfig) in the translation: dp_shard_size becomes FSDP2 on
ModelParallelStrategy's mesh, explain() says how each size maps onto the mesh, and sizes hf_lightning cannot
run are refused before training, naming the field. The 2-process runs themselves are in
tests/strategies/test_fsdp_cpu.py (`bert_dp_shard`) and tests/strategies/test_tensor_parallel_cpu.py (tp_size)."""

from __future__ import annotations

import pytest
from accelerate.parallelism_config import ParallelismConfig

from hf_lightning import Trainer, TrainingArguments
from hf_lightning.translation.environment import Environment
from hf_lightning.translation.translate import explain, translate
from tests.models import make_regression_mlp, regression_data

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


@pytest.mark.parametrize("config", [ParallelismConfig(tp_size=2), {"tp_size": 2}], ids=["object", "dict"])
def test_tp_runs_on_the_mesh_tensor_parallel_dimension(config):
    plan = translate(_args(config), env=TWO_PROCESSES)
    assert plan.strategy.name == "tp"
    assert plan.strategy.tensor_parallel_size == 2
    assert plan.notes["parallelism_config"].status == "honoured"
    text = explain(plan)
    assert (
        "data_parallel=1 (one replica: every rank gets the same batches), tensor_parallel=2 (tp_size" in text
    )
    assert "HFTensorParallelStrategy" in text


def test_tp_strategy_is_lightnings_model_parallel_mesh():
    from lightning.pytorch.strategies import ModelParallelStrategy

    from hf_lightning.strategies.build import build_strategy

    strategy = build_strategy(translate(_args(ParallelismConfig(tp_size=2)), env=TWO_PROCESSES), model=None)
    assert isinstance(strategy, ModelParallelStrategy)
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (1, 2)


def test_the_model_needs_a_tp_plan_with_heads_that_divide():
    from hf_lightning.strategies.tensor_parallel.plans import (
        SPLIT_BY_THE_TRAINER,
        resolved_tp_plan,
        tp_model_refusal,
    )
    from tests.distributed.tp_train_script import make_tiny_llama
    from tests.models import make_tiny_gpt2

    llama = make_tiny_llama()
    assert tp_model_refusal(llama, 2) is None
    plan = resolved_tp_plan(llama, 2)
    assert plan["model.layers.1.self_attn.q_proj"] == "colwise"
    assert plan["model.layers.1.mlp.down_proj"] == "rowwise"
    assert "parallelism_config.tp_size=2: GPT2LMHeadModel has no tensor-parallel plan" in tp_model_refusal(
        make_tiny_gpt2(), 2
    )
    assert "has no tensor-parallel plan" in tp_model_refusal(make_regression_mlp(), 2)
    assert tp_model_refusal(llama, 1) is None
    llama._tp_size = 2  # as transformers marks a model it split at load (from_pretrained tp_plan)
    assert "parallelism_config=ParallelismConfig(tp_size=2)" in tp_model_refusal(llama, 1)
    assert "load it without tp_plan: the Trainer applies" in tp_model_refusal(llama, 2)
    setattr(llama, SPLIT_BY_THE_TRAINER, True)  # split by an earlier run of ours: a later Trainer may take it
    assert tp_model_refusal(llama, 2) is None
    assert "split over 2 ranks by an earlier run; make them equal" in tp_model_refusal(llama, 4)
    delattr(llama, SPLIT_BY_THE_TRAINER)
    llama._tp_size = None
    # 4 query heads, 2 key/value heads: 4 ranks cannot share 2 heads evenly.
    assert "config.num_key_value_heads=2 does not divide by tp_size" in tp_model_refusal(llama, 4)


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
        (ParallelismConfig(tp_size=4), TWO_PROCESSES, {}, "= 4 processes, but the launch has world_size=2"),
        (
            {"tp_size": 2, "dp_shard_size": 2},
            Environment(world_size=4, local_world_size=4, is_distributed_launch=True),
            {},
            "parallelism_config.tp_size=2 with dp_shard_size=2: tensor parallelism combined with data",
        ),
        (
            ParallelismConfig(tp_size=2),
            TWO_PROCESSES,
            {"fsdp": "full_shard"},
            "parallelism_config.tp_size=2 and fsdp are both set",
        ),
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
    ids=[
        "product",
        "not_launched",
        "tp_product",
        "tp_with_dp_shard",
        "tp_with_fsdp",
        "cp",
        "replicate",
        "fsdp1",
    ],
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
        parallelism_config=ParallelismConfig(cp_size=2),
    )
    with pytest.raises(ValueError, match="parallelism_config"):
        Trainer(model=make_regression_mlp(), args=args, train_dataset=regression_data()).train()
    assert not any(tmp_path.iterdir())  # nothing written: refused before the run started
