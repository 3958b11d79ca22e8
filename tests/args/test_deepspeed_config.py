"""DeepSpeed config resolution (R7.1, T13) against the reference's own code as the oracle.

transformers' `HfTrainerDeepSpeedConfig` (`trainer_config_process` at argument time, `trainer_config_finalize`
at train start), accelerate's `DeepSpeedPlugin` / `set_mixed_precision` and transformers' `deepspeed_optim_sched`
run on the same config and arguments as ours; none of them needs a GPU or imports deepspeed. Only the strategy
tests at the end construct Lightning's `DeepSpeedStrategy` (which imports deepspeed, CPU accelerator).
"""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
import torch
import transformers
from accelerate.utils import DeepSpeedPlugin
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, deepspeed_optim_sched

from hf_lightning import TrainingArguments
from hf_lightning.args.deepspeed_config import (
    apply_plugin_defaults,
    fill_at_argument_time,
    fill_at_train_start,
    finalize_deepspeed_config,
    is_offload,
    load_deepspeed_config,
    resolve_deepspeed_config,
)
from hf_lightning.translation.environment import Environment
from hf_lightning.translation.translate import translate

GPU = Environment(cuda_available=True, cuda_device_count=1, installed_packages=frozenset({"deepspeed"}))

ALL_AUTO = {
    "train_micro_batch_size_per_gpu": "auto",
    "train_batch_size": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
    },
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
            "total_num_steps": "auto",
        },
    },
    "fp16": {"enabled": "auto"},
    "bf16": {"enabled": "auto"},
    "zero_optimization": {
        "stage": 3,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
    },
}
SPEC_ARGS = {
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 3,
    "learning_rate": 3e-4,
    "weight_decay": 0.1,
    "max_grad_norm": 0.7,
    "adam_beta2": 0.95,
    "warmup_steps": 0.1,
}


def _model(**config: object) -> SimpleNamespace:
    """A model as the reference sees it here: only `model.config` is read."""
    return SimpleNamespace(config=SimpleNamespace(**config))


HIDDEN_64 = _model(hidden_size=64)


def _with(base: dict, **changes: object) -> dict:
    config = copy.deepcopy(base)
    config.update(changes)
    return config


def _zero(stage: int, **keys: object) -> dict:
    return {"stage": stage, **keys}


class _WorldSized:
    """Reference arguments as seen by a process of a `world_size`-process launch (the oracle reads attributes)."""

    def __init__(self, args: transformers.TrainingArguments, world_size: int):
        self._args, self.world_size = args, world_size

    def __getattr__(self, name: str) -> object:
        return getattr(self._args, name)


def _both_args(tmp_path, **kwargs: object) -> tuple[TrainingArguments, transformers.TrainingArguments]:
    common = {"use_cpu": True, "report_to": "none", **kwargs}
    return (
        TrainingArguments(output_dir=str(tmp_path / "ours"), **common),
        transformers.TrainingArguments(output_dir=str(tmp_path / "ref"), **common),
    )


def _reference(config: dict, args, model, num_training_steps: int, auto_find_batch_size: bool = False):
    """The reference's two stages; returns (config, mismatches) or the ValueError finalize raised."""
    reference = HfTrainerDeepSpeedConfig(config)
    reference.trainer_config_process(args, auto_find_batch_size)
    try:
        reference.trainer_config_finalize(args, model, num_training_steps)
    except ValueError as error:
        return error
    return reference.config, reference.mismatches


def _ours(
    config: dict, args, model, num_training_steps: int, world_size: int = 1, auto_find_batch_size=False
):
    ours = load_deepspeed_config(config)
    mismatches = fill_at_argument_time(ours, args, world_size, auto_find_batch_size)
    try:
        fill_at_train_start(ours, mismatches, args, model, num_training_steps)
    except ValueError as error:
        return error
    return ours, mismatches


# ---------------------------------------------------------------- the two reference stages, table-driven

TABLE = [
    pytest.param(ALL_AUTO, SPEC_ARGS, HIDDEN_64, 100, 1, id="spec-check-all-auto-zero3"),
    pytest.param(
        _with(
            ALL_AUTO,
            zero_optimization=_zero(2, reduce_bucket_size="auto", stage3_prefetch_bucket_size="auto"),
        ),
        {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "warmup_steps": 5},
        _model(hidden_sizes=[8, 32, 16]),
        40,
        1,
        id="zero2-buckets-from-max-hidden-sizes",
    ),
    pytest.param(
        _with(
            ALL_AUTO,
            zero_optimization=_zero(3, reduce_bucket_size="auto", stage3_param_persistence_threshold=7),
        ),
        {"warmup_steps": 0, "bf16": True, "max_grad_norm": 0.0},
        _model(text_config=SimpleNamespace(hidden_size=24)),
        10,
        1,
        id="zero3-text-config-hidden-bf16-no-warmup",
    ),
    pytest.param(
        ALL_AUTO,
        {"per_device_train_batch_size": 3, "gradient_accumulation_steps": 2, "bf16_full_eval": True},
        HIDDEN_64,
        12,
        4,
        id="world-size-4-train-batch",
    ),
    pytest.param(
        {
            "train_micro_batch_size_per_gpu": 4,
            "train_batch_size": 12,
            "gradient_clipping": 0.7,
            "optimizer": {"params": {"lr": 3e-4, "betas": [0.9, 0.95]}},
            "scheduler": {"params": {"warmup_max_lr": 3e-4, "total_num_steps": 100, "warmup_num_steps": 10}},
            "zero_optimization": _zero(1),
        },
        SPEC_ARGS,
        HIDDEN_64,
        100,
        1,
        id="explicit-values-that-match",
    ),
    pytest.param(
        {
            "zero_optimization": _zero(2),
            "optimizer": {"type": "SGD"},
            "checkpoint": {"tag_validation": "Warn"},
        },
        {"save_on_each_node": True},
        _model(),
        5,
        1,
        id="missing-keys-stay-missing-and-node-local-checkpoints",
    ),
]


@pytest.mark.parametrize(("config", "arguments", "model", "steps", "world_size"), TABLE)
def test_filled_config_equals_the_references(tmp_path, config, arguments, model, steps, world_size):
    ours_args, reference_args = _both_args(tmp_path, **arguments)
    expected = _reference(config, _WorldSized(reference_args, world_size), model, steps)
    assert not isinstance(expected, ValueError), expected
    assert _ours(config, ours_args, model, steps, world_size) == expected


def test_spec_check_values(tmp_path):
    """R7.1's recorded example (the all-"auto" config), value by value."""
    ours_args, _ = _both_args(tmp_path, **SPEC_ARGS)
    config, mismatches = _ours(ALL_AUTO, ours_args, HIDDEN_64, 100)
    assert mismatches == []
    assert (config["train_micro_batch_size_per_gpu"], config["train_batch_size"]) == (4, 12)
    assert (config["gradient_accumulation_steps"], config["gradient_clipping"]) == (3, 0.7)
    assert config["optimizer"]["params"] == {
        "lr": 3e-4,
        "betas": [0.9, 0.95],
        "eps": 1e-8,
        "weight_decay": 0.1,
    }
    assert config["scheduler"]["params"] == {
        "warmup_min_lr": 0,
        "warmup_max_lr": 3e-4,
        "warmup_num_steps": 10,
        "total_num_steps": 100,
    }
    zero = config["zero_optimization"]
    buckets = (zero["reduce_bucket_size"], zero["stage3_prefetch_bucket_size"])
    assert (*buckets, zero["stage3_param_persistence_threshold"]) == (4096, 3686, 640)
    assert (config["fp16"], config["bf16"]) == ({"enabled": False}, {"enabled": False})


def test_auto_find_batch_size_fills_batch_keys_without_matching(tmp_path):
    config = {"train_micro_batch_size_per_gpu": 16, "train_batch_size": 16, "zero_optimization": _zero(2)}
    ours_args, reference_args = _both_args(tmp_path, per_device_train_batch_size=4)
    expected = _reference(config, reference_args, _model(), 5, auto_find_batch_size=True)
    assert _ours(config, ours_args, _model(), 5, auto_find_batch_size=True) == expected
    assert expected[1] == []
    assert isinstance(_ours(config, ours_args, _model(), 5), ValueError)


# ---------------------------------------------------------------- mismatches (T13)


@pytest.mark.parametrize(
    ("config", "arguments", "words"),
    [
        pytest.param(
            {
                "train_micro_batch_size_per_gpu": 2,
                "optimizer": {"params": {"lr": 1e-3}},
                "zero_optimization": {},
            },
            {"per_device_train_batch_size": 4},
            [
                "train_micro_batch_size_per_gpu=2 vs hf per_device_train_batch_size=4",
                "lr=0.001 vs hf learning_rate=5e-05",
            ],
            id="spec-check-two-argument-time-mismatches",
        ),
        pytest.param(
            {
                "scheduler": {"params": {"total_num_steps": 50, "warmup_num_steps": 3}},
                "zero_optimization": {},
            },
            {"warmup_steps": 0.1},
            [
                "total_num_steps=50 vs hf num_training_steps (calculated)=100",
                "warmup_num_steps=3 vs hf warmup_steps=10",
            ],
            id="train-start-mismatches",
        ),
        pytest.param(
            {"gradient_clipping": 1.0, "bf16": {"enabled": True}, "zero_optimization": {}},
            {"max_grad_norm": 0.5},
            [
                "gradient_clipping=1.0 vs hf max_grad_norm=0.5",
                "bf16.enabled=True vs hf bf16|bf16_full_eval=False",
            ],
            id="clipping-and-precision",
        ),
    ],
)
def test_conflicting_explicit_values_raise_the_references_error(tmp_path, config, arguments, words):
    ours_args, reference_args = _both_args(tmp_path, **arguments)
    expected = _reference(config, reference_args, HIDDEN_64, 100)
    ours = _ours(config, ours_args, HIDDEN_64, 100)
    assert isinstance(expected, ValueError) and isinstance(ours, ValueError)
    assert str(ours) == str(expected)
    assert all(word in str(ours) for word in words), str(ours)
    assert "The easiest method is to set these DeepSpeed config values to 'auto'." in str(ours)


def test_auto_bucket_sizes_without_a_hidden_size_raise_the_references_error(tmp_path):
    config = {"zero_optimization": _zero(3, reduce_bucket_size="auto")}
    ours_args, reference_args = _both_args(tmp_path)
    no_config = SimpleNamespace()
    expected = _reference(config, reference_args, no_config, 10)
    ours = _ours(config, ours_args, no_config, 10)
    assert isinstance(ours, ValueError) and str(ours) == str(expected)
    assert "zero_optimization.reduce_bucket_size" in str(ours)


# ---------------------------------------------------------------- accelerate's additions and the prepare step


def _reference_final(config: dict, args, model, steps: int) -> dict:
    """Everything the reference does before `deepspeed.initialize`: process, plugin, mixed precision, finalize,
    optimizer/scheduler choice (a stub trainer builds the trainer's optimizer)."""
    reference = HfTrainerDeepSpeedConfig(config)
    reference.trainer_config_process(args)
    plugin = DeepSpeedPlugin(hf_ds_config=reference)
    plugin.set_mixed_precision(args.mixed_precision)
    reference.trainer_config_finalize(args, model, steps)
    parameter = torch.nn.Parameter(torch.zeros(1))
    stub = SimpleNamespace(create_optimizer=lambda: torch.optim.AdamW([parameter]))
    deepspeed_optim_sched(stub, reference, args, steps, [parameter])
    return reference.config


@pytest.mark.parametrize(
    ("config", "arguments"),
    [
        pytest.param(
            {"zero_optimization": {"stage": "auto", "offload_optimizer": {"device": "auto"}}},
            {},
            id="plugin-autos-no-sections",
        ),
        pytest.param(
            {"bf16": {"enabled": "auto"}, "zero_optimization": _zero(2)},
            {"bf16": True, "gradient_accumulation_steps": 2},
            id="bf16-args-keep-section",
        ),
        pytest.param({"zero_optimization": _zero(1)}, {"bf16": True}, id="bf16-args-add-section"),
        pytest.param(
            _with(ALL_AUTO, zero_optimization=_zero(3, stage3_gather_16bit_weights_on_model_save="auto")),
            SPEC_ARGS,
            id="all-auto-with-config-optimizer",
        ),
    ],
)
def test_final_config_equals_what_the_reference_hands_to_deepspeed(tmp_path, config, arguments):
    ours_args, reference_args = _both_args(tmp_path, **arguments)
    expected = _reference_final(config, reference_args, HIDDEN_64, 20)
    resolved = resolve_deepspeed_config(config, ours_args, world_size=1)
    assert finalize_deepspeed_config(resolved, ours_args, HIDDEN_64, 20) == expected


def test_mixed_precision_conflicting_with_the_config_raises_as_accelerate(tmp_path):
    config = {"fp16": {"enabled": True}, "zero_optimization": _zero(2)}
    with pytest.raises(ValueError, match="cannot be set to `bf16` when `fp16` is set") as reference:
        DeepSpeedPlugin(hf_ds_config=config).set_mixed_precision("bf16")
    with pytest.raises(ValueError) as ours:
        apply_plugin_defaults(copy.deepcopy(config), "bf16")
    assert str(ours.value) == str(reference.value)


def test_config_path_works_and_the_users_dict_is_untouched(tmp_path):
    user = copy.deepcopy(ALL_AUTO)
    args, _ = _both_args(tmp_path, **SPEC_ARGS)
    from_dict = resolve_deepspeed_config(user, args, world_size=1)
    assert user == ALL_AUTO
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(ALL_AUTO))
    from_path = resolve_deepspeed_config(str(path), args, world_size=1)
    assert from_path == from_dict
    final = finalize_deepspeed_config(from_dict, args, HIDDEN_64, 100)
    assert final["zero_optimization"]["reduce_bucket_size"] == 4096
    assert from_dict.config["zero_optimization"]["reduce_bucket_size"] == "auto"  # finalised on a copy


# ---------------------------------------------------------------- the plan and Lightning's strategy

OFFLOAD_ZERO3 = _with(
    ALL_AUTO,
    zero_optimization=_zero(
        3,
        reduce_bucket_size="auto",
        stage3_prefetch_bucket_size="auto",
        stage3_param_persistence_threshold="auto",
        offload_optimizer={"device": "cpu", "pin_memory": True},
        offload_param={"device": "cpu"},
    ),
)


def _gpu_args(tmp_path, config: dict, **kwargs: object) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), report_to="none", deepspeed=config, **kwargs)


def test_plan_holds_the_argument_time_config_and_the_strategy_the_final_one(tmp_path):
    from lightning.pytorch.strategies import DeepSpeedStrategy

    from hf_lightning.strategies.build import build_strategy
    from hf_lightning.strategies.deepspeed.strategy import HFDeepSpeedStrategy, build_deepspeed_strategy

    args = _gpu_args(tmp_path, OFFLOAD_ZERO3, **SPEC_ARGS)
    plan = translate(args, GPU)
    assert plan.strategy.name == "deepspeed" and plan.notes["deepspeed"].status == "honoured"
    details = plan.strategy.deepspeed
    assert (list(details.mismatches), details.zero_stage, is_offload(details.config)) == ([], 3, True)
    planned = details.config
    assert planned["train_batch_size"] == 12 and planned["zero_optimization"]["reduce_bucket_size"] == "auto"

    _, reference_args = _both_args(tmp_path, **SPEC_ARGS)
    strategy = build_deepspeed_strategy(plan, HIDDEN_64, args=args, num_training_steps=100)
    assert isinstance(strategy, DeepSpeedStrategy)
    assert strategy.config == _reference_final(OFFLOAD_ZERO3, reference_args, HIDDEN_64, 100)
    assert strategy.zero_stage_3 and strategy.config["gradient_accumulation_steps"] == 3
    zero = strategy.config["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert zero["offload_param"] == {"device": "cpu"}
    assert (zero["reduce_bucket_size"], zero["stage3_prefetch_bucket_size"]) == (4096, 3686)
    strategy._format_batch_size_and_grad_accum_config()  # Lightning's version refuses the accumulation key
    assert strategy.config["gradient_accumulation_steps"] == 3
    assert args.deepspeed == OFFLOAD_ZERO3  # neither the plan nor the strategy wrote into the user's dict

    deferred = build_strategy(plan, HIDDEN_64)  # lightning_bridge's call: finalised at setup, from the facade
    assert isinstance(deferred, HFDeepSpeedStrategy) and not deferred.config_finalized
    assert deferred.config["zero_optimization"]["reduce_bucket_size"] == "auto"


def test_strategy_finalisation_raises_mismatches_before_training(tmp_path):
    from hf_lightning.strategies.deepspeed.strategy import build_deepspeed_strategy

    config = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"params": {"lr": 1e-3}},
        "zero_optimization": _zero(2),
    }
    args = _gpu_args(tmp_path, config, per_device_train_batch_size=4)
    plan = translate(args, GPU)
    assert len(plan.strategy.deepspeed.mismatches) == 2
    assert "2 mismatch(es)" in plan.notes["deepspeed"].how
    with pytest.raises(ValueError, match="mismatch TrainingArguments") as error:
        build_deepspeed_strategy(plan, HIDDEN_64, args=args, num_training_steps=10)
    assert "per_device_train_batch_size=4" in str(error.value) and "learning_rate=5e-05" in str(error.value)


@pytest.mark.parametrize(
    ("config", "arguments", "env", "words"),
    [
        ({"zero_optimization": _zero(2)}, {}, Environment(), ["CUDA"]),
        (
            {"zero_optimization": _zero(2)},
            {},
            Environment(cuda_available=True, cuda_device_count=1),
            ["pip install"],
        ),
        (
            {"zero_optimization": _zero(3)},
            {"auto_find_batch_size": True},
            GPU,
            ["auto_find_batch_size", "Zero-3"],
        ),
        (
            {"zero_optimization": _zero(2)},
            {
                "save_only_model": True,
                "load_best_model_at_end": True,
                "eval_strategy": "steps",
                "eval_steps": 10,
                "save_steps": 10,
            },
            GPU,
            ["save_only_model", "load_best_model_at_end"],
        ),
        # ACCELERATE_MIXED_PRECISION=bf16 (bf16=True itself needs a bf16 GPU at argument time).
        ({"fp16": {"enabled": True}, "zero_optimization": _zero(2)}, {}, GPU, ["mixed_precision", "`bf16`"]),
    ],
)
def test_refusals_name_the_field_and_the_fix(tmp_path, monkeypatch, config, arguments, env, words):
    if "fp16" in config:
        monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    args = _gpu_args(tmp_path, config, **arguments)
    with pytest.raises(ValueError) as error:
        translate(args, env)
    message = str(error.value)
    assert "deepspeed" in message and all(word in message for word in words), message


def test_deepspeed_plugin_is_set_as_the_reference_sets_it():
    """TRL's trainers read `args.deepspeed_plugin` (and its `zero_stage`) whenever a peft_config is given."""
    import transformers

    from hf_lightning import TrainingArguments

    plain = dict(output_dir="unused", report_to="none", use_cpu=True)
    assert transformers.TrainingArguments(**plain).deepspeed_plugin is None
    assert TrainingArguments(**plain).deepspeed_plugin is None
    ours = TrainingArguments(**plain, deepspeed={"zero_optimization": {"stage": 3}})
    assert ours.deepspeed_plugin.zero_stage == 3 and ours.deepspeed_plugin.is_zero3()
    assert ours.deepspeed_plugin.deepspeed_config is ours.hf_deepspeed_config


def test_every_attribute_the_references_post_init_sets_exists_on_ours():
    import dataclasses

    import transformers

    from hf_lightning import TrainingArguments

    plain = dict(output_dir="unused", report_to="none", use_cpu=True)
    reference, ours = transformers.TrainingArguments(**plain), TrainingArguments(**plain)
    fields = {field.name for field in dataclasses.fields(reference)}
    set_by_post_init = {name for name in vars(reference) if name not in fields}
    # Private caches of accelerate's device set-up: ours has its `n_gpu` / `device` properties instead.
    private = {"_n_gpu", "_setup_devices"}
    assert sorted(name for name in set_by_post_init - private if not hasattr(ours, name)) == []
