"""Every setting the `Plan` carries is filled by the registry and read by the engine.

A field the registry fills and nothing outside `hf_lightning/translation/` reads is a setting reported
honoured and then ignored; a field nothing fills is dead. Reads are found by scanning the package's
source for attribute access on plan objects; fills by recording what the handlers contribute while
translating a set of arguments that switch every setting on.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import lightning
import pytest

from hf_lightning.args.training_args import TrainingArguments
from hf_lightning.translation import translate as translate_module
from hf_lightning.translation.environment import Environment
from hf_lightning.translation.plan import (
    CheckpointSettings,
    DeepSpeedDetails,
    EvaluationSettings,
    FSDPDetails,
    HubSettings,
    LightningKwargs,
    LoggingSettings,
    ModuleSettings,
    Plan,
    StrategyPlan,
)

PACKAGE = Path(translate_module.__file__).resolve().parents[1]
TRANSLATION = PACKAGE / "translation"

# How engine code names each plan object: `trainer.plan.module`, or a local bound to it.
RECEIVERS = {
    ModuleSettings: r"(\bplan\.module|\bsettings)",
    StrategyPlan: r"(\bplan\.strategy|\bstrategy)",
    FSDPDetails: r"(\.fsdp|\bdetails)",
    DeepSpeedDetails: r"(\.deepspeed|\bdetails)",
    LightningKwargs: r"\bplan\.lightning",
    EvaluationSettings: r"\bplan\.evaluation",
    CheckpointSettings: r"\bplan\.checkpointing",
    LoggingSettings: r"\bplan\.logging",
    HubSettings: r"\bplan\.hub",
}
SECTIONS = {
    EvaluationSettings: "evaluation",
    CheckpointSettings: "checkpointing",
    LoggingSettings: "logging",
    HubSettings: "hub",
}


def _engine_reads() -> dict[type, set[str]]:
    """Attribute names read on each plan type's receivers, in the package outside `translation/`."""
    reads: dict[type, set[str]] = {kind: set() for kind in RECEIVERS}
    for path in PACKAGE.rglob("*.py"):
        if TRANSLATION in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Attribute):
                continue
            receiver = ast.unparse(node.value)
            for kind, pattern in RECEIVERS.items():
                if re.search(pattern + r"$", receiver):
                    reads[kind].add(node.attr)
    return reads


READS = _engine_reads()


def _field_names(kind: type) -> list[str]:
    return [item.name for item in dataclasses.fields(kind)]


@pytest.mark.parametrize("kind", [ModuleSettings, StrategyPlan, FSDPDetails, DeepSpeedDetails, *SECTIONS])
def test_every_setting_is_read_outside_the_translation(kind):
    unread = [name for name in _field_names(kind) if name not in READS[kind]]
    assert unread == [], f"{kind.__name__} fields the engine never reads: {unread}"


def test_every_lightning_kwarg_reaches_lightning_trainer():
    # The builder hands `as_kwargs()` to lightning.Trainer whole: each field must be a Trainer parameter.
    assert "as_kwargs" in READS[LightningKwargs]
    parameters = inspect.signature(lightning.Trainer.__init__).parameters
    assert set(LightningKwargs().as_kwargs()) == set(_field_names(LightningKwargs))
    assert [name for name in _field_names(LightningKwargs) if name not in parameters] == []


def test_the_scan_sees_a_read_and_misses_a_name_nobody_reads():
    # The scan can fail: it finds a known read and not an invented one.
    assert "gradient_accumulation_steps" in READS[ModuleSettings]
    assert "state_dict_type" in READS[FSDPDetails]
    assert "no_such_setting" not in READS[ModuleSettings]


# ---------------------------------------------------------------- filled by the registry

CPU = Environment()
DDP_2 = Environment(world_size=2, local_world_size=2, is_distributed_launch=True)
ONE_GPU_DEEPSPEED = Environment(
    cuda_available=True, cuda_device_count=1, installed_packages=frozenset({"deepspeed"})
)


def _arguments(tmp_path, **kwargs) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), report_to="none", **kwargs)


def _override(args, **values):
    # Set after construction where the arguments would otherwise check the machine (a process group, CUDA).
    for name, value in values.items():
        setattr(args, name, value)
    return args


def _representative_plans(tmp_path) -> list[tuple[Plan, dict[str, set[str]]]]:
    """Plans that switch every setting on, each with the keys the handlers contributed to each part."""
    cases = [
        (
            _arguments(
                tmp_path,
                use_cpu=True,
                activation_checkpointing=True,
                activation_checkpointing_kwargs={"use_reentrant": False},
                torch_compile=True,
                torch_compile_backend="eager",
                torch_compile_mode="default",
                neftune_noise_alpha=5.0,
                torch_empty_cache_steps=3,
                include_num_input_tokens_seen="all",
                label_smoothing_factor=0.1,
                max_grad_norm=0.5,
                full_determinism=True,
                accelerator_config={
                    "split_batches": True,
                    "dispatch_batches": False,
                    "even_batches": False,
                    "use_seedable_sampler": False,
                    "gradient_accumulation_kwargs": {"num_steps": 2, "sync_each_batch": True},
                },
            ),
            CPU,
        ),
        (
            _override(
                _arguments(tmp_path, use_cpu=True),
                ddp_backend="gloo",
                ddp_timeout=60,
                ddp_find_unused_parameters=False,
                ddp_bucket_cap_mb=25,
                ddp_broadcast_buffers=False,
                ddp_static_graph=True,
            ),
            DDP_2,
        ),
        (_override(_arguments(tmp_path, use_cpu=True), fsdp=True), DDP_2),
        (
            _override(
                _arguments(tmp_path),
                deepspeed={"zero_optimization": {"stage": 2}, "optimizer": {"params": {"lr": 1e-3}}},
            ),
            ONE_GPU_DEEPSPEED,
        ),
        (_override(_arguments(tmp_path, use_cpu=True), bf16=True), CPU),
        # parallelism_config.tp_size: the tensor-parallel strategy's mesh size.
        (_override(_arguments(tmp_path, use_cpu=True), parallelism_config={"tp_size": 2}), DDP_2),
        # report_to carried by the reference's own integration callback (logging.integrations).
        (
            _override(_arguments(tmp_path, use_cpu=True), report_to=["tensorboard"]),
            Environment(installed_loggers=frozenset({"tensorboard"}), reference_integrations=True),
        ),
    ]
    merge = translate_module._merge
    plans = []
    for args, env in cases:
        filled: dict[str, set[str]] = {part: set() for part in ("lightning", "module", "strategy", *SECTIONS.values())}

        def recording(target, update, field_name, what, owners, filled=filled):
            filled[what].update(update)
            merge(target, update, field_name, what, owners)

        translate_module._merge = recording
        try:
            plans.append((translate_module.translate(args, env), filled))
        finally:
            translate_module._merge = merge
    return plans


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    return _representative_plans(tmp_path_factory.mktemp("plans"))


def test_every_module_setting_is_filled_by_a_handler(plans):
    filled = set().union(*(keys["module"] for _, keys in plans))
    assert [name for name in _field_names(ModuleSettings) if name not in filled] == []
    switched_on = plans[0][0].module
    assert switched_on.gradient_accumulation_steps == 2 and switched_on.sync_each_batch is True


@pytest.mark.parametrize("kind", list(SECTIONS), ids=list(SECTIONS.values()))
def test_every_section_setting_is_filled_by_a_handler(plans, kind):
    filled = set().union(*(keys[SECTIONS[kind]] for _, keys in plans))
    # The loggers' specs come from report_to's own contribution (translation/logger_specs.py), not a carried field.
    expected = [name for name in _field_names(kind) if (kind, name) != (LoggingSettings, "loggers")]
    assert [name for name in expected if name not in filled] == []


def test_every_strategy_option_is_filled_by_a_handler(plans):
    filled = set().union(*(keys["strategy"] for _, keys in plans))
    # `name` is the strategy translate selected; every other field comes from a handler.
    assert [name for name in _field_names(StrategyPlan) if name != "name" and name not in filled] == []
    assert [plan.strategy.name for plan, _ in plans[1:4]] == ["ddp", "fsdp2", "deepspeed"]


def test_every_strategy_detail_carries_a_planned_value(plans):
    fsdp, deepspeed = plans[2][0].strategy.fsdp, plans[3][0].strategy.deepspeed
    assert (fsdp.version, fsdp.state_dict_type) == (2, "FULL_STATE_DICT") and fsdp.plugin_args
    assert deepspeed.zero_stage == 2 and len(deepspeed.mismatches) == 1 and deepspeed.config


# Settings of the engine's contract with Lightning, the same for every run (manual optimization, the facade's
# samplers, seeding, progress, saving and logging); `max_steps` / `max_epochs` are resolved at train start.
ENGINE_CONTRACT = {
    "max_steps",
    "max_epochs",
    "accumulate_grad_batches",
    "gradient_clip_val",
    "use_distributed_sampler",
    "enable_checkpointing",
    "enable_progress_bar",
    "enable_model_summary",
    "num_sanity_val_steps",
    "limit_val_batches",
    "logger",
    "log_every_n_steps",
    "inference_mode",
}


def test_every_lightning_kwarg_is_planned(plans):
    # Each field is filled by a handler, set by translate (it differs between the plans) or a contract value.
    filled = set().union(*(keys["lightning"] for _, keys in plans))
    varies = {
        name
        for name in _field_names(LightningKwargs)
        if len({getattr(p.lightning, name) for p, _ in plans}) > 1
    }
    assert [
        name for name in _field_names(LightningKwargs) if name not in filled | varies | ENGINE_CONTRACT
    ] == []
    # The contract list stays honest: no planned field hides in it, and none of it varies.
    assert ENGINE_CONTRACT & (filled | varies) == set()
    assert ENGINE_CONTRACT <= set(_field_names(LightningKwargs))
