"""FSDP arguments -> Lightning strategies (R7.2), checked against the reference: transformers' normalised
`fsdp_plugin_args`, and accelerate's `FullyShardedDataParallelPlugin` built from them (wrap decisions, sharding,
offload, prefetch, state dict type, mixed precision). No process group: the strategies are built, not run
(tests/strategies/test_fsdp_cpu.py runs them)."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.distributed as dist
import transformers
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
from torch.distributed.fsdp import (
    BackwardPrefetch,
    FSDPModule,
    MixedPrecision,
    MixedPrecisionPolicy,
    ShardingStrategy,
)

import hf_lightning
from hf_lightning.engine.module import HFLightningModule
from hf_lightning.engine.precision import forward_only_mixed_precision_class
from hf_lightning.strategies.build import build_strategy
from hf_lightning.strategies.fsdp.strategy import HFFSDP2Strategy, HFFSDPStrategy, build_fsdp_strategy
from hf_lightning.translation.environment import Environment
from hf_lightning.translation.handlers.distributed import fsdp_plugin_args
from hf_lightning.translation.translate import translate
from tests.models import make_tiny_bert_classifier, make_tiny_gpt2

GPU_2 = Environment(
    cuda_available=True, cuda_device_count=2, world_size=2, local_world_size=2, is_distributed_launch=True
)
CPU_2 = Environment(world_size=2, local_world_size=2, is_distributed_launch=True)

# id -> (fsdp, fsdp_config): each fsdp_config option, the v4 option strings, FSDP1 and FSDP2.
CASES = {
    "v4_full_shard_auto_wrap": ("full_shard auto_wrap", None),
    "v4_shard_grad_op_offload": ("shard_grad_op offload", {}),
    "prefixed_layer_class": (True, {"fsdp_transformer_layer_cls_to_wrap": "BertLayer"}),
    "size_wrap": (True, {"auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 1000}),
    "size_wrap_without_minimum": (True, {"auto_wrap_policy": "SIZE_BASED_WRAP"}),
    "no_wrap": (True, {"auto_wrap_policy": "NO_WRAP"}),
    "json_strings": (
        True,
        {
            "activation_checkpointing": "true",
            "state_dict_type": "SHARDED_STATE_DICT",
            "reshard_after_forward": "false",
            "cpu_ram_efficient_loading": "true",
            "cpu_offload": "false",  # [quirk] truthiness only: enables offload
        },
    ),
    "v1_hybrid_shard": ("hybrid_shard", {"version": 1}),
    "v1_every_option": (
        "shard_grad_op auto_wrap offload",
        {
            "version": 1,
            "backward_prefetch": "backward_pre",
            "forward_prefetch": "true",
            "use_orig_params": "false",
            "sync_module_states": "false",
            "limit_all_gathers": "false",
            "activation_checkpointing": True,
            "state_dict_type": "SHARDED_STATE_DICT",
            "transformer_layer_cls_to_wrap": ["BertLayer"],
        },
    ),
    "v1_no_shard_size_wrap": (
        True,
        {
            "version": 1,
            "reshard_after_forward": "no_shard",
            "auto_wrap_policy": "SIZE_BASED_WRAP",
            "min_num_params": 1000,
            "cpu_ram_efficient_loading": True,
            "sync_module_states": False,
        },
    ),
    "v1_hybrid_zero2_no_wrap": (
        True,
        {"version": 1, "reshard_after_forward": "hybrid_shard_zero2", "auto_wrap_policy": "NO_WRAP"},
    ),
}

# Hand-written expectations for the BERT model (2 layers; `_no_split_modules` = BertEmbeddings, BertLayer).
EXPECTED_WRAPPED = {
    "v4_full_shard_auto_wrap": {"BertEmbeddings", "BertLayer"},
    "prefixed_layer_class": {"BertLayer"},
    "v1_every_option": {"BertLayer"},
    "v1_hybrid_shard": {"BertEmbeddings", "BertLayer"},
}


@pytest.fixture(autouse=True)
def _restore_fsdp_env(monkeypatch):
    # TrainingArguments and accelerate's plugin export these variables; keep them out of later tests.
    for name in ("FSDP_CPU_RAM_EFFICIENT_LOADING", "ACCELERATE_USE_FSDP"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def bert():
    return make_tiny_bert_classifier()


def _arguments(cls, tmp_path, fsdp, config, **extra):
    kwargs = {"fsdp": fsdp, **extra}
    if config is not None:
        kwargs["fsdp_config"] = copy.deepcopy(config)
    args = cls(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kwargs)
    args.use_cpu = False  # translate for a 2-GPU torchrun launch (this machine has no GPU)
    return args


def _pair(tmp_path, case, **extra):
    fsdp, config = CASES[case]
    ours = _arguments(hf_lightning.TrainingArguments, tmp_path / "ours", fsdp, config, **extra)
    reference = _arguments(transformers.TrainingArguments, tmp_path / "ref", fsdp, config, **extra)
    return ours, reference


def _accelerate_plugin(reference_plugin_args, model):
    """accelerate's plugin for these arguments, wrap policy resolved with the model. Its FSDP1 `sync_module_states`
    needs a GPU to build (it only adds a meta-device init function), so it is built without it."""
    kwargs = dict(reference_plugin_args)
    if kwargs["fsdp_version"] == 1:
        kwargs.update(sync_module_states=False, cpu_ram_efficient_loading=False)
    plugin = FullyShardedDataParallelPlugin(**kwargs)
    plugin.set_auto_wrap_policy(model)
    return plugin


def _v1_wrapped(policy, model):
    if policy is None:
        return None
    return {
        name
        for name, module in model.named_modules()
        if name
        and policy(module=module, recurse=False, nonwrapped_numel=sum(p.numel() for p in module.parameters()))
    }


def _v2_wrapped(predicate, model):
    if predicate is None:
        return None
    return {name for name, module in model.named_modules() if name and predicate(module)}


@pytest.mark.parametrize("case", list(CASES))
def test_plugin_arguments_and_config_are_the_references(tmp_path, case):
    ours, reference = _pair(tmp_path, case)
    assert ours.fsdp_config == reference.fsdp_config
    assert fsdp_plugin_args(reference) == reference.fsdp_plugin_args
    assert fsdp_plugin_args(ours) == reference.fsdp_plugin_args
    # Computed from the raw values too (an attribute set after construction), without touching them.
    fsdp, config = CASES[case]
    raw = transformers.TrainingArguments(output_dir=str(tmp_path / "raw"), use_cpu=True, report_to="none")
    raw.fsdp, raw.fsdp_config = fsdp, copy.deepcopy(config)
    assert fsdp_plugin_args(raw) == reference.fsdp_plugin_args
    assert raw.fsdp_config == config
    plan = translate(reference, GPU_2)
    assert plan.strategy.name == ("fsdp" if reference.fsdp_plugin_args["fsdp_version"] == 1 else "fsdp2")
    assert plan.strategy.fsdp.plugin_args == reference.fsdp_plugin_args
    assert plan.notes["fsdp"].status == "honoured"


@pytest.mark.parametrize("case", [case for case in CASES if not case.startswith("v1")])
def test_fsdp2_strategy_carries_accelerates_settings(tmp_path, bert, case):
    _, reference = _pair(tmp_path, case)
    strategy = build_strategy(translate(reference, GPU_2), bert)
    plugin = _accelerate_plugin(reference.fsdp_plugin_args, bert)
    assert isinstance(strategy, HFFSDP2Strategy)
    assert strategy.reshard_after_forward is plugin.reshard_after_forward
    assert type(strategy.offload_policy) is type(plugin.cpu_offload)
    assert strategy.activation_checkpointing == plugin.activation_checkpointing
    assert strategy.cpu_ram_efficient_loading == plugin.cpu_ram_efficient_loading
    sharded = "SHARDED" in str(plugin.state_dict_type)
    assert (
        strategy._save_distributed_checkpoint == sharded
        and (strategy.state_dict_type == "SHARDED_STATE_DICT") == sharded
    )
    assert strategy._data_parallel_size == 2 and strategy._tensor_parallel_size == 1
    assert strategy.mp_policy == MixedPrecisionPolicy()  # full precision: no casting policy
    wrapped = _v2_wrapped(strategy.wrap_predicate, bert)
    assert wrapped == _v2_wrapped(fsdp2_prepare_auto_wrap_policy(plugin, bert), bert)
    if case in EXPECTED_WRAPPED:
        assert {type(bert.get_submodule(name)).__name__ for name in wrapped} == EXPECTED_WRAPPED[case]


@pytest.mark.parametrize("case", [case for case in CASES if case.startswith("v1")])
def test_fsdp1_strategy_carries_accelerates_settings(tmp_path, bert, case):
    _, reference = _pair(tmp_path, case)
    plugin_args = reference.fsdp_plugin_args
    strategy = build_strategy(translate(reference, GPU_2), bert)
    plugin = _accelerate_plugin(plugin_args, bert)
    assert isinstance(strategy, HFFSDPStrategy)
    # The strategy accelerate derives from reshard_after_forward. [divergence] accelerate then builds FSDP1 with
    # its `sharding_strategy`, which defaults to FULL_SHARD (env FSDP_SHARDING_STRATEGY) and wins; hf_lightning
    # honours the requested one (same updates, the memory layout asked for).
    assert strategy.sharding_strategy == plugin.reshard_after_forward
    assert plugin.sharding_strategy == ShardingStrategy.FULL_SHARD
    assert strategy.cpu_offload.offload_params == plugin.cpu_offload.offload_params
    assert strategy.kwargs["backward_prefetch"] == plugin.backward_prefetch
    assert strategy.kwargs["forward_prefetch"] == plugin.forward_prefetch
    assert strategy.kwargs["use_orig_params"] == plugin.use_orig_params
    assert strategy.kwargs["limit_all_gathers"] == plugin.limit_all_gathers
    # accelerate forces sync_module_states on with cpu_ram_efficient_loading.
    expected_sync = plugin_args["sync_module_states"] or plugin_args["cpu_ram_efficient_loading"]
    assert strategy.kwargs["sync_module_states"] == expected_sync
    assert strategy._state_dict_type == ("sharded" if "SHARDED" in str(plugin.state_dict_type) else "full")
    assert bool(strategy._activation_checkpointing_kwargs) == plugin.activation_checkpointing
    assert strategy.mixed_precision is None and plugin.mixed_precision_policy is None
    policy = strategy.kwargs.get("auto_wrap_policy")
    wrapped = _v1_wrapped(policy, bert)
    assert wrapped == _v1_wrapped(plugin.auto_wrap_policy, bert)
    if plugin.activation_checkpointing:  # checkpointed layers are the wrapped ones, as accelerate applies it
        assert strategy._activation_checkpointing_kwargs == {"auto_wrap_policy": policy}
    if case in EXPECTED_WRAPPED:
        assert {type(bert.get_submodule(name)).__name__ for name in wrapped} == EXPECTED_WRAPPED[case]


def test_fsdp1_hand_written_settings(tmp_path, bert):
    """The settings of two FSDP1 cases spelled out, independent of accelerate's plugin."""
    _, reference = _pair(tmp_path, "v1_every_option")
    strategy = build_fsdp_strategy(translate(reference, GPU_2), bert)
    assert (
        strategy.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP and strategy.cpu_offload.offload_params
    )
    assert strategy.kwargs["backward_prefetch"] == BackwardPrefetch.BACKWARD_PRE
    assert strategy.kwargs["forward_prefetch"] and not strategy.kwargs["use_orig_params"]
    assert not strategy.kwargs["sync_module_states"] and not strategy.kwargs["limit_all_gathers"]
    _, reference = _pair(tmp_path, "v1_hybrid_zero2_no_wrap")
    strategy = build_fsdp_strategy(translate(reference, GPU_2), bert)
    assert strategy.sharding_strategy == ShardingStrategy._HYBRID_SHARD_ZERO2
    assert "auto_wrap_policy" not in strategy.kwargs and strategy.kwargs["device_mesh"] == (1, 2)
    assert strategy.kwargs["backward_prefetch"] is None  # NO_PREFETCH, not torch's BACKWARD_PRE default


@pytest.mark.parametrize("version", [1, 2])
def test_mixed_precision_is_accelerates_policy(tmp_path, bert, version):
    fsdp, config = "full_shard auto_wrap", {"version": version}
    reference = _arguments(transformers.TrainingArguments, tmp_path, fsdp, config, bf16=True)
    strategy = build_strategy(translate(reference, GPU_2), bert)
    plugin = _accelerate_plugin(reference.fsdp_plugin_args, bert)
    plugin.set_mixed_precision("bf16")  # what accelerate's state does for a bf16 run
    if version == 1:
        assert strategy.mixed_precision == plugin.mixed_precision_policy
        assert strategy.mixed_precision == MixedPrecision(torch.bfloat16, torch.bfloat16, torch.bfloat16)
    else:
        assert strategy.mp_policy == plugin.mixed_precision_policy
        assert strategy.mp_policy.output_dtype == torch.bfloat16
        assert strategy.owns_forward_precision  # accelerate autocasts no FSDP2 forward


def test_fp16_under_fsdp1_keeps_the_sharded_scaler_without_step_autocast(tmp_path, bert):
    reference = _arguments(transformers.TrainingArguments, tmp_path, "full_shard", {"version": 1})
    reference.fp16 = True
    plan = translate(reference, GPU_2)
    strategy = build_strategy(plan, bert)
    assert strategy.mixed_precision == MixedPrecision(torch.float16, torch.float16, torch.float16)
    strategy.precision_plugin = forward_only_mixed_precision_class()("16-mixed", device="cuda")
    plugin = strategy.precision_plugin
    assert type(plugin).__name__ == "ForwardOnlyFSDPPrecision" and plugin.precision == "16-mixed"
    assert type(plugin.scaler).__name__ == "ShardedGradScaler"
    assert isinstance(plugin.forward_context(), contextlib.nullcontext)


def test_cpu_fsdp_is_honoured_and_unknown_layer_classes_are_refused(tmp_path, bert):
    reference = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        fsdp=True,
        fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]},
    )
    plan = translate(reference, CPU_2)
    assert plan.lightning.accelerator == "cpu" and plan.strategy.name == "fsdp2"
    assert "CPU" in plan.notes["fsdp"].how
    with pytest.raises(ValueError, match="LlamaDecoderLayer"):
        build_strategy(plan, bert)


REFUSALS = {
    "no launch": ({"fsdp": True}, Environment(cuda_available=True, cuda_device_count=1), "torchrun"),
    "activation checkpointing twice": (
        {"fsdp": True, "fsdp_config": {"activation_checkpointing": True}, "activation_checkpointing": True},
        GPU_2,
        "activation_checkpointing",
    ),
    "save_only_model with best model": (
        {
            "fsdp": True,
            "save_only_model": True,
            "load_best_model_at_end": True,
            "eval_strategy": "steps",
            "save_strategy": "steps",
        },
        GPU_2,
        "save_only_model",
    ),
    "save_only_model sharded": (
        {"fsdp": True, "save_only_model": True, "fsdp_config": {"state_dict_type": "SHARDED_STATE_DICT"}},
        GPU_2,
        "SHARDED_STATE_DICT",
    ),
    "torch_compile": ({"fsdp": True}, GPU_2, "torch_compile"),
    "fsdp2 checkpointing without wrap": (
        {"fsdp": True, "fsdp_config": {"activation_checkpointing": True, "auto_wrap_policy": "NO_WRAP"}},
        GPU_2,
        "NO_WRAP",
    ),
    "xla": ({"fsdp": True, "fsdp_config": {"xla": True}}, GPU_2, "xla"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals_name_the_field(tmp_path, case):
    kwargs, env, words = REFUSALS[case]
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    for name, value in kwargs.items():  # set after construction: validation of this CPU machine aside
        setattr(args, name, value)
    args.use_cpu = False
    args.torch_compile = case == "torch_compile"
    with pytest.raises(ValueError, match="fsdp") as error:
        translate(args, env)
    assert words in str(error.value)


# ---- the sharding itself, in one process (a world of 1 on gloo) ---------------------------------------------


@pytest.fixture
def one_process_group():
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class _Facade:
    def __init__(self, model):
        self.model = self.model_wrapped = model
        self.is_fsdp_enabled = False
        self.optimizer = self.lr_scheduler = None


class _Module:
    """What the strategies use of HFLightningModule: `.facade`, a settable `.model` and its hand-over method."""

    adopt_wrapped_model = HFLightningModule.adopt_wrapped_model

    def __init__(self, model):
        self.facade = _Facade(model)
        self.model = model


def _fsdp2_units(tmp_path, model, config):
    from torch.distributed.device_mesh import init_device_mesh

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", fsdp=True, fsdp_config=config
    )
    plan = translate(args, Environment(world_size=1, is_distributed_launch=True))
    strategy = build_strategy(plan, model)
    strategy._device_mesh = init_device_mesh(
        "cpu", (1, 1), mesh_dim_names=("data_parallel", "tensor_parallel")
    )
    module = _Module(model)
    strategy.shard_user_model(module)
    assert module.facade.model is model and module.facade.is_fsdp_enabled
    return {name or "<root>" for name, sub in model.named_modules() if isinstance(sub, FSDPModule)}


def test_fsdp2_shards_the_policys_layers_and_accelerates_extra_units(tmp_path, one_process_group):
    bert = make_tiny_bert_classifier()
    units = _fsdp2_units(tmp_path, bert, {"activation_checkpointing": True})
    # Each layer class (BertEmbeddings is one: its word embeddings stay in that unit) is checkpointed, then both the
    # checkpoint wrapper and the layer inside get a unit, as accelerate's bottom-up pass does; no final norm.
    layers = {"bert.encoder.layer.0", "bert.encoder.layer.1", "bert.embeddings"}
    assert units == layers | {f"{name}._checkpoint_wrapped_module" for name in layers} | {"<root>"}
    gpt2 = make_tiny_gpt2()
    units = _fsdp2_units(tmp_path, gpt2, {})
    # Tied input/output embeddings and the final norm form one tail unit (one FSDP state for the three modules).
    tail = {"transformer.ln_f", "transformer.wte", "lm_head"}
    assert units == {"transformer.h.0", "transformer.h.1", "<root>"} | tail
    states = {id(gpt2.get_submodule(name)._get_fsdp_state()) for name in tail}
    assert len(states) == 1 and id(gpt2._get_fsdp_state()) not in states
    assert gpt2.lm_head.weight is gpt2.transformer.wte.weight


def test_fsdp1_wraps_the_user_model_on_cpu(tmp_path, one_process_group):
    from torch.distributed.fsdp import FullyShardedDataParallel

    bert = make_tiny_bert_classifier()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", fsdp=True, fsdp_config={"version": 1}
    )
    strategy = build_strategy(translate(args, Environment(world_size=1, is_distributed_launch=True)), bert)
    strategy.parallel_devices = [torch.device("cpu")]
    module = _Module(bert)
    assert strategy._setup_model(module) is module
    wrapped = module.facade.model
    assert isinstance(wrapped, FullyShardedDataParallel) and wrapped.module is bert
    assert module.model is wrapped and module.facade.model_wrapped is wrapped
    inner = {
        type(m.module).__name__ for m in FullyShardedDataParallel.fsdp_modules(wrapped) if m is not wrapped
    }
    assert inner == {"BertEmbeddings", "BertLayer"}


def test_build_refuses_a_plan_without_fsdp(tmp_path, bert):
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    with pytest.raises(ValueError, match="FSDP"):
        build_fsdp_strategy(translate(args, CPU_2), bert)


@pytest.mark.parametrize("version", [1, 2])
def test_an_optimizer_passed_by_the_user_is_refused(tmp_path, version):
    """The reference refuses `optimizers=` with FSDP: it would update the unwrapped model's parameters."""
    bert = make_tiny_bert_classifier()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", fsdp=True, fsdp_config={"version": version}
    )
    strategy = build_strategy(translate(args, Environment(world_size=1, is_distributed_launch=True)), bert)
    strategy.parallel_devices = [torch.device("cpu")]
    module = _Module(bert)
    module.facade.optimizer = torch.optim.SGD(bert.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="Passing `optimizers` is not allowed"):
        if version == 1:
            strategy._setup_model(module)
        else:
            strategy.shard_user_model(module)


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model_fsdp.bin", "pytorch_model_fsdp_0"])
def test_an_fsdp_run_resumes_from_any_layouts_weights(tmp_path, weights):
    """Checked before training starts: whichever layout wrote the weights (a run without FSDP, FSDP full or sharded)
    resumes under FSDP, whatever its state_dict_type (the check reads only the folder); a folder without weights is
    refused."""
    from hf_lightning.strategies.fsdp.checkpoint import FSDPCheckpointIO

    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    with pytest.raises(ValueError, match="Can't find a valid checkpoint"):
        FSDPCheckpointIO().check_resumable(str(checkpoint))
    (checkpoint / weights).mkdir() if weights.endswith("_0") else (checkpoint / weights).write_bytes(b"")
    FSDPCheckpointIO().check_resumable(str(checkpoint))
