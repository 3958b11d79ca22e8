"""TrainingArguments parity with the reference (transformers 5.24): fields, normalisation, validation,
serialisation, properties, setters, DeepSpeed / FSDP processing and conversion (R1.1-R1.11, V1-V16, R7.1, R7.2)."""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import warnings

import pytest
import transformers
from transformers import Seq2SeqTrainingArguments as RefSeq2SeqArgs
from transformers import TrainingArguments as RefArgs

from hf_lightning.args.accelerator_config import AcceleratorConfig
from hf_lightning.args.training_args import Seq2SeqTrainingArguments, TrainingArguments, as_training_arguments
from hf_lightning.core.enums import IntervalStrategy, OptimizerNames, ParallelMode, SaveStrategy

_LAUNCH_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "ACCELERATE_USE_CPU", "ACCELERATE_MIXED_PRECISION")


@pytest.fixture(autouse=True)
def _single_process_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both implementations read the launcher env; start every test from a plain single process."""
    for name in _LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)


def _quiet(cls: type, **kwargs: object):
    """Build without the deprecation warnings both sides emit for legacy inputs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(**kwargs)


# ---------------------------------------------------------------- R1.1 field catalogue


def _default(f: dataclasses.Field) -> object:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


@pytest.mark.parametrize(
    ("ours", "ref"), [(TrainingArguments, RefArgs), (Seq2SeqTrainingArguments, RefSeq2SeqArgs)]
)
def test_fields_match_reference(ours: type, ref: type) -> None:
    our_fields, ref_fields = dataclasses.fields(ours), dataclasses.fields(ref)
    assert [f.name for f in our_fields] == [f.name for f in ref_fields]
    assert len(our_fields) == (114 if ours is TrainingArguments else 119)
    for mine, theirs in zip(our_fields, ref_fields):
        assert _default(mine) == _default(theirs), mine.name
        assert (mine.default_factory is dataclasses.MISSING) == (
            theirs.default_factory is dataclasses.MISSING
        )
        assert mine.init == theirs.init and mine.kw_only == theirs.kw_only, mine.name
        # Same CLI surface: help text, choices, nargs/const.
        assert _cli_metadata(mine) == _cli_metadata(theirs), mine.name


def _cli_metadata(f: dataclasses.Field) -> dict:
    return {k: list(v) if k == "choices" else v for k, v in f.metadata.items()}


def test_enums_match_reference() -> None:
    from transformers import debug_utils, trainer_utils, training_args

    import hf_lightning.core.enums as enums

    pairs = [
        (enums.IntervalStrategy, trainer_utils.IntervalStrategy),
        (enums.SaveStrategy, trainer_utils.SaveStrategy),
        (enums.HubStrategy, trainer_utils.HubStrategy),
        (enums.SchedulerType, trainer_utils.SchedulerType),
        (enums.OptimizerNames, training_args.OptimizerNames),
        (enums.DebugOption, debug_utils.DebugOption),
        (enums.FSDPOption, trainer_utils.FSDPOption),
        (enums.ParallelMode, training_args.ParallelMode),
    ]
    for ours, ref in pairs:
        assert [(m.name, m.value) for m in ours] == [(m.name, m.value) for m in ref], ours.__name__
    assert len(enums.OptimizerNames) == 41
    assert enums.IntervalStrategy.STEPS == "steps" == trainer_utils.IntervalStrategy.STEPS
    with pytest.raises(ValueError, match=r"not a valid SaveStrategy, please select one of \['no', 'steps'"):
        enums.SaveStrategy("sometimes")


def test_signature_shows_only_v5_fields() -> None:
    import inspect

    params = list(inspect.signature(TrainingArguments).parameters)
    assert params == [f.name for f in dataclasses.fields(RefArgs)]
    assert "evaluation_strategy" not in params


def test_optim_default_follows_torch_version() -> None:
    assert TrainingArguments().optim == RefArgs().optim == OptimizerNames.ADAMW_TORCH_FUSED


# ---------------------------------------------------------------- R1.2 normalisation, parity on to_dict()

_CONSTRUCTIONS = {
    "defaults": {},
    "use_cpu": {"use_cpu": True},
    "eval_steps_from_logging_ratio": {"eval_strategy": "steps", "logging_steps": 0.1},
    "eval_steps_from_logging_when_logging_epoch": {"eval_strategy": "steps", "logging_strategy": "epoch"},
    "metric_f1": {"metric_for_best_model": "eval_f1"},
    "metric_loss": {"metric_for_best_model": "eval_loss"},
    "metric_from_plateau": {"lr_scheduler_type": "reduce_lr_on_plateau", "eval_strategy": "epoch"},
    "save_best_does_not_default_metric": {"save_strategy": "best", "eval_strategy": "steps"},
    "lbm_matching_steps": {
        "load_best_model_at_end": True,
        "eval_strategy": "steps",
        "eval_steps": 100,
        "save_steps": 200,
    },
    "lbm_matching_epoch": {
        "load_best_model_at_end": True,
        "eval_strategy": "epoch",
        "save_strategy": "epoch",
    },
    "lbm_save_best": {"load_best_model_at_end": True, "eval_strategy": "steps", "save_strategy": "best"},
    "lbm_ratios": {
        "load_best_model_at_end": True,
        "eval_strategy": "steps",
        "eval_steps": 0.1,
        "save_steps": 0.3,
    },
    "report_to_all": {"report_to": "all"},
    "report_to_none_list": {"report_to": ["none"]},
    "report_to_str": {"report_to": "tensorboard"},
    "report_to_list": {"report_to": ["wandb", "tensorboard"]},
    "lr_scheduler_kwargs_json": {
        "lr_scheduler_kwargs": '{"num_cycles":"2","flag":"true","x":"0.5","y":"-1","z":"1e-5"}'
    },
    "activation_kwargs_json": {
        "activation_checkpointing_kwargs": '{"every_n_layers": "2", "offload": "FALSE"}'
    },
    "gradient_checkpointing": {"gradient_checkpointing": True},
    "gradient_checkpointing_kwargs": {"gradient_checkpointing_kwargs": {"use_reentrant": False}},
    "activation_checkpointing_wins": {"activation_checkpointing": False, "gradient_checkpointing": True},
    "fsdp_legacy_string": {"fsdp": "full_shard offload auto_wrap"},
    "fsdp_shard_grad_op": {"fsdp": "shard_grad_op"},
    "fsdp_prefixed_keys": {"fsdp": True, "fsdp_config": {"fsdp_transformer_layer_cls_to_wrap": "BertLayer"}},
    "fsdp_v1": {"fsdp": "hybrid_shard", "fsdp_config": {"version": 1, "backward_prefetch": "backward_pre"}},
    "fsdp_size_wrap": {
        "fsdp": True,
        "fsdp_config": {"auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 10},
    },
    "fsdp_json": {
        "fsdp": True,
        "fsdp_config": '{"cpu_offload": "false", "activation_checkpointing": "true"}',
    },
    "tokens_seen_true": {"include_num_input_tokens_seen": True},
    "tokens_seen_false": {"include_num_input_tokens_seen": False},
    "float_logging_steps": {"logging_steps": 3.0},
    "ratio_not_checked_off_strategy": {"save_steps": 1.5, "save_strategy": "epoch"},
    "torch_compile_mode": {"torch_compile_mode": "max-autotune"},
    "debug_words": {"debug": "underflow_overflow tpu_metrics_debug"},
    "debug_list_kept": {"debug": ["underflow_overflow"]},
    "accelerator_dict": {"accelerator_config": {"even_batches": False, "non_blocking": True}},
    "accelerator_json": {"accelerator_config": '{"split_batches": "true"}'},
    "output_dir_tilde": {"output_dir": "~/runs/x"},
    "bf16_on_cpu": {"bf16": True, "use_cpu": True},
    "fp16_full_eval": {"fp16_full_eval": True},
    "hub_token": {"hub_token": "secret", "hub_model_id": "me/model"},
    "tf32_false_on_cpu": {"tf32": False},
    "eval_delay_and_batches": {"eval_strategy": "epoch", "eval_delay": 2, "per_device_eval_batch_size": 3},
}


@pytest.mark.parametrize("kwargs", list(_CONSTRUCTIONS.values()), ids=list(_CONSTRUCTIONS))
def test_construction_matches_reference(kwargs: dict) -> None:
    ours, ref = _quiet(TrainingArguments, **kwargs), _quiet(RefArgs, **kwargs)
    # No normalisation needed: to_dict(), str() and the sanitized dict agree exactly on all of these.
    assert ours.to_dict() == ref.to_dict()
    assert str(ours) == str(ref)
    assert ours.to_sanitized_dict() == ref.to_sanitized_dict()
    assert ours.fsdp_plugin_args == ref.fsdp_plugin_args
    assert ours.mixed_precision == ref.mixed_precision
    for name in (
        "activation_checkpointing",
        "gradient_checkpointing",
        "eval_steps",
        "logging_steps",
        "save_steps",
    ):
        assert getattr(ours, name) == getattr(ref, name)
        assert type(getattr(ours, name)) is type(getattr(ref, name)), name


def test_r12_check_values() -> None:
    args = TrainingArguments(eval_strategy="steps", logging_steps=0.1)
    assert args.eval_steps == 0.1 and args.do_eval is True
    assert TrainingArguments(metric_for_best_model="eval_f1").greater_is_better is True
    assert TrainingArguments(metric_for_best_model="eval_loss").greater_is_better is False
    kwargs = TrainingArguments(
        lr_scheduler_kwargs='{"num_cycles":"2","flag":"true","x":"0.5"}'
    ).lr_scheduler_kwargs
    assert kwargs == {"num_cycles": 2, "flag": True, "x": 0.5}
    with pytest.warns(FutureWarning, match="gradient_checkpointing"):
        args = TrainingArguments(gradient_checkpointing=True)
    assert args.activation_checkpointing is True and args.gradient_checkpointing is True
    assert TrainingArguments(logging_steps=3.0).logging_steps == 3
    assert type(TrainingArguments(logging_steps=3.0).logging_steps) is int
    assert TrainingArguments(logging_steps=1.0).logging_steps == 1.0
    assert TrainingArguments(save_steps=1.5, save_strategy="epoch").save_steps == 1.5
    assert TrainingArguments(eval_strategy="epoch").eval_strategy is IntervalStrategy.EPOCH
    assert TrainingArguments(save_strategy="best").save_strategy is SaveStrategy.BEST


def test_kubeflow_env_appends_reporter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "http://x")
    assert TrainingArguments().report_to == RefArgs().report_to == ["kubeflow"]
    monkeypatch.setenv("DISABLE_KUBEFLOW_INTEGRATION", "true")
    assert TrainingArguments().report_to == RefArgs().report_to == []


def test_mixed_precision_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    assert TrainingArguments().mixed_precision == RefArgs().mixed_precision == "fp16"


def test_accelerator_config_forms(tmp_path) -> None:
    path = tmp_path / "acc.json"
    path.write_text(json.dumps({"even_batches": False}))
    ours, ref = TrainingArguments(accelerator_config=str(path)), RefArgs(accelerator_config=str(path))
    assert ours.to_dict()["accelerator_config"] == ref.to_dict()["accelerator_config"]
    assert ours.accelerator_config.even_batches is False
    instance = AcceleratorConfig(split_batches=True)
    assert TrainingArguments(accelerator_config=instance).accelerator_config is instance
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"even_batches": False, "bogus": 1}))
    for cls in (TrainingArguments, RefArgs):
        with pytest.raises(ValueError, match="bogus"):
            cls(accelerator_config=str(bad))
    # The reference raises TypeError (dataclass __init__) for an unknown dict key; we say which key.
    with pytest.raises(ValueError, match="accelerator_config.*bogus"):
        TrainingArguments(accelerator_config={"bogus": 1})
    from transformers.trainer_pt_utils import AcceleratorConfig as RefAcceleratorConfig

    for cls, config_cls in ((TrainingArguments, AcceleratorConfig), (RefArgs, RefAcceleratorConfig)):
        with pytest.raises(NotImplementedError):
            cls(accelerator_config=config_cls)
    # use_configured_state=True: the reference takes the process state configured before (one exists once any
    # TrainingArguments was built) and pops the key; ours accepts it too (sentence-transformers builds one in every
    # trainer constructor), with the same serialisation.
    RefArgs(output_dir="unused")
    reference = RefArgs(output_dir="unused", accelerator_config={"use_configured_state": True})
    ours = TrainingArguments(output_dir="unused", accelerator_config={"use_configured_state": True})
    assert ours.to_dict()["accelerator_config"] == reference.to_dict()["accelerator_config"]
    assert "use_configured_state" not in ours.to_dict()["accelerator_config"]


def test_use_cpu_disables_pin_memory() -> None:
    assert TrainingArguments(use_cpu=True).dataloader_pin_memory is False
    assert TrainingArguments().dataloader_pin_memory is True


def test_fsdp_check_lines() -> None:
    args = _quiet(TrainingArguments, fsdp="full_shard offload auto_wrap")
    assert args.fsdp is True
    assert args.fsdp_plugin_args == {
        "fsdp_version": 2,
        "cpu_offload": True,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "cpu_ram_efficient_loading": False,
        "state_dict_type": "FULL_STATE_DICT",
        "reshard_after_forward": True,
    }
    args = TrainingArguments(fsdp=True, fsdp_config={"fsdp_transformer_layer_cls_to_wrap": "BertLayer"})
    assert args.fsdp_plugin_args["transformer_cls_names_to_wrap"] == "BertLayer"
    # [quirk] cpu_offload is tested for truthiness only: the string "false" enables offload.
    assert (
        TrainingArguments(fsdp=True, fsdp_config={"cpu_offload": "false"}).fsdp_plugin_args["cpu_offload"]
        is True
    )
    assert TrainingArguments().fsdp_plugin_args is None


def test_fsdp_config_from_file(tmp_path) -> None:
    path = tmp_path / "fsdp.json"
    path.write_text(json.dumps({"fsdp_state_dict_type": "SHARDED_STATE_DICT", "version": 2}))
    ours, ref = TrainingArguments(fsdp=True, fsdp_config=str(path)), RefArgs(fsdp=True, fsdp_config=str(path))
    assert ours.fsdp_plugin_args == ref.fsdp_plugin_args
    assert ours.fsdp_config == ref.fsdp_config


# ---------------------------------------------------------------- R1.3 validation V1..V15

_INVALID = {
    "V1_float": ({"torch_empty_cache_steps": 1.0}, "torch_empty_cache_steps"),
    "V1_zero": ({"torch_empty_cache_steps": 0}, "torch_empty_cache_steps"),
    "V2": ({"logging_steps": 0}, "logging_steps"),
    "V3_logging": ({"logging_steps": 2.5}, "logging_steps"),
    "V3_eval": ({"eval_strategy": "steps", "eval_steps": 2.5}, "eval_steps"),
    "V3_save": ({"save_steps": 2.5}, "save_steps"),
    "V4_eval_no": ({"load_best_model_at_end": True}, "load_best_model_at_end"),
    "V4_mismatch": (
        {"load_best_model_at_end": True, "eval_strategy": "epoch", "save_strategy": "steps"},
        "eval_strategy",
    ),
    "V5_absolute": (
        {"load_best_model_at_end": True, "eval_strategy": "steps", "eval_steps": 100, "save_steps": 250},
        "save_steps",
    ),
    "V5_ratios": (
        {"load_best_model_at_end": True, "eval_strategy": "steps", "eval_steps": 0.2, "save_steps": 0.3},
        "save_steps",
    ),
    "V5_mixed": (
        {"load_best_model_at_end": True, "eval_strategy": "steps", "eval_steps": 0.1, "save_steps": 500},
        "eval_steps",
    ),
    "V6_bf16": ({"bf16": True}, "bf16"),
    "V6_bf16_full_eval": ({"bf16_full_eval": True}, "bf16_full_eval"),
    "V7": ({"fp16": True, "bf16": True, "use_cpu": True}, "fp16"),
    "V8": ({"fp16_full_eval": True, "bf16_full_eval": True, "use_cpu": True}, "bf16_full_eval"),
    "V9_plateau": ({"lr_scheduler_type": "reduce_lr_on_plateau"}, "eval_strategy"),
    "V9_greedy": ({"lr_scheduler_type": "greedy"}, "eval_strategy"),
    "V10": ({"warmup_steps": -1}, "warmup_steps"),
    "V11": ({"dataloader_prefetch_factor": 2}, "dataloader_prefetch_factor"),
    "V12": ({"eval_strategy": "steps", "logging_strategy": "epoch", "logging_steps": 0}, "eval_steps"),
    "V13_optim": ({"optim": "adamw_foo"}, "optim"),
    "V13_eval_strategy": ({"eval_strategy": "sometimes"}, "eval_strategy"),
    "V13_logging_strategy": ({"logging_strategy": "x"}, "logging_strategy"),
    "V13_save_strategy": ({"save_strategy": "x"}, "save_strategy"),
    "V13_hub_strategy": ({"hub_strategy": "x"}, "hub_strategy"),
    "V13_scheduler": ({"lr_scheduler_type": "x"}, "lr_scheduler_type"),
    "V13_debug": ({"debug": "nope"}, "debug"),
    "V14": ({"tf32": True}, "tf32"),
    "V14_use_cpu": ({"tf32": True, "use_cpu": True}, "tf32"),
    "V15_unknown_word": ({"fsdp": "full_shard bogus"}, "fsdp"),
    "V15_fsdp1_word": ({"fsdp": "hybrid_shard"}, "fsdp"),
    "V15_upper_case_word": ({"fsdp": "FULL_SHARD"}, "fsdp"),
    "V15_wrap_policy": (
        {"fsdp": True, "fsdp_config": {"auto_wrap_policy": "transformer_based_wrap"}},
        "auto_wrap_policy",
    ),
}


@pytest.mark.parametrize(("kwargs", "field_name"), list(_INVALID.values()), ids=list(_INVALID))
def test_validation_rule_raises_in_both(kwargs: dict, field_name: str) -> None:
    with pytest.raises(ValueError) as ours:
        _quiet(TrainingArguments, **kwargs)
    assert f"{field_name}" in str(ours.value)
    # Every one of these is also rejected by the reference at argument construction (CPU machine).
    with pytest.raises(ValueError):
        _quiet(RefArgs, **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"load_best_model_at_end": True, "eval_strategy": "steps", "eval_steps": 0.1, "save_steps": 0.3},
        {"bf16": True, "use_cpu": True},
        {"save_steps": 1.5, "save_strategy": "epoch"},
        {"dataloader_prefetch_factor": 2, "dataloader_num_workers": 1},
        {"fsdp": "shard_grad_op hybrid_shard", "fsdp_config": {"version": 1}},
    ],
)
def test_accepted_edge_cases_in_both(kwargs: dict) -> None:
    assert _quiet(TrainingArguments, **kwargs).to_dict() == _quiet(RefArgs, **kwargs).to_dict()


# ---------------------------------------------------------------- R1.6 serialisation


def test_token_redaction_and_sanitized_dict() -> None:
    for token in (None, "secret"):
        args = TrainingArguments(hub_token=token, report_to="tensorboard")
        assert args.to_dict()["hub_token"] == "<HUB_TOKEN>"
        assert (
            "secret" not in args.to_json_string() and "secret" not in str(args) and "secret" not in repr(args)
        )
    sanitized = TrainingArguments(report_to="tensorboard").to_sanitized_dict()
    assert len(sanitized) == 116
    assert sanitized["report_to"] == "['tensorboard']"
    assert sanitized["eval_steps"] == "None" and sanitized["train_batch_size"] == 8
    assert json.loads(TrainingArguments().to_json_string()) == RefArgs().to_dict()


def test_seq2seq_serialisation_and_sortish_warning() -> None:
    from transformers import GenerationConfig

    generation = GenerationConfig(max_new_tokens=5, num_beams=2)
    kwargs = {"predict_with_generate": True, "generation_max_length": 7, "generation_config": generation}
    ours, ref = Seq2SeqTrainingArguments(**kwargs), RefSeq2SeqArgs(**kwargs)
    assert ours.to_dict() == ref.to_dict()
    assert isinstance(ours.to_dict()["generation_config"], dict)
    assert len(ours.to_dict()) == 119
    with pytest.warns(UserWarning, match="sortish_sampler"):
        args = Seq2SeqTrainingArguments(sortish_sampler=True)
    assert args.to_dict() == RefSeq2SeqArgs(sortish_sampler=True).to_dict()
    # The reference's Seq2Seq repr is the generated dataclass repr and shows the token; ours redacts.
    assert "secret" not in repr(Seq2SeqTrainingArguments(hub_token="secret"))


def test_dtype_in_nested_dict_becomes_string() -> None:
    import torch

    ours = TrainingArguments(lr_scheduler_kwargs={"inner": {"dtype": torch.float16}})
    ref = RefArgs(lr_scheduler_kwargs={"inner": {"dtype": torch.float16}})
    assert (
        ours.to_dict()["lr_scheduler_kwargs"]
        == ref.to_dict()["lr_scheduler_kwargs"]
        == {"inner": {"dtype": "float16"}}
    )
    # The reference's to_dict() edits its own field in place; ours converts a copy.
    assert ours.lr_scheduler_kwargs["inner"]["dtype"] is torch.float16


def test_round_trip_through_to_dict() -> None:
    args = _quiet(
        TrainingArguments, eval_strategy="steps", eval_steps=5, fsdp="full_shard", report_to="tensorboard"
    )
    again = TrainingArguments(**{k: v for k, v in args.to_dict().items() if k != "hub_token"})
    assert again.to_dict() == args.to_dict()


# ---------------------------------------------------------------- R1.7 / R1.8 properties


def test_properties_single_process_cpu() -> None:
    ours, ref = TrainingArguments(use_cpu=True), RefArgs(use_cpu=True)
    for name in ("n_gpu", "train_batch_size", "eval_batch_size", "world_size", "process_index"):
        assert getattr(ours, name) == getattr(ref, name), name
    assert ours.local_process_index == ref.local_process_index == 0
    assert ours.should_log and ours.should_save and ours.place_model_on_device is None
    assert str(ours.device) == str(ref.device) == "cpu"
    assert ours.parallel_mode.value == ref.parallel_mode.value == ParallelMode.NOT_PARALLEL.value
    assert ours.ddp_timeout_delta == ref.ddp_timeout_delta
    # Without use_cpu on a machine without CUDA the reference also reports 0 GPUs and the CPU.
    plain, ref_plain = TrainingArguments(), RefArgs()
    assert (plain.n_gpu, str(plain.device)) == (ref_plain.n_gpu, str(ref_plain.device))


def test_properties_under_launcher_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    args = TrainingArguments(use_cpu=True, per_device_train_batch_size=3)
    assert (args.world_size, args.process_index, args.local_process_index) == (4, 2, 0)
    assert args.parallel_mode is ParallelMode.DISTRIBUTED
    assert args.should_log is True  # log_on_each_node: local main
    assert args.should_save is False  # save only on global rank 0
    assert TrainingArguments(log_on_each_node=False).should_log is False
    assert TrainingArguments(save_on_each_node=True).should_save is True
    assert args.n_gpu == 0 and args.train_batch_size == 3
    assert (
        TrainingArguments(
            log_level="info", log_level_replica="error", log_on_each_node=False
        ).get_process_log_level()
        == 40
    )


def test_get_process_log_level_matches_reference() -> None:
    assert TrainingArguments(log_level="error").get_process_log_level() == 40
    assert TrainingArguments().get_process_log_level() == RefArgs().get_process_log_level() == 30
    previous = transformers.logging.get_verbosity()
    try:
        transformers.logging.set_verbosity_info()
        assert (
            TrainingArguments().get_process_log_level() == RefArgs().get_process_log_level() == logging.INFO
        )
        transformers.logging.set_verbosity_error()
        assert TrainingArguments().disable_tqdm is RefArgs().disable_tqdm is True
    finally:
        transformers.logging.set_verbosity(previous)
    with pytest.raises(KeyError):
        TrainingArguments(log_level="loud").get_process_log_level()


def test_main_process_first_single_process_runs_body() -> None:
    ran = []
    with TrainingArguments().main_process_first(desc="map"):
        ran.append(1)
    assert ran == [1]


@pytest.mark.parametrize(
    ("warmup", "steps", "expected"),
    [(0.05, 33, 2), (7.9, 33, 7), (1.0, 33, 1), (0, 33, 0), (0.5, 3, 2), (3, 100, 3)],
)
def test_get_warmup_steps(warmup: float, steps: int, expected: int) -> None:
    assert TrainingArguments(warmup_steps=warmup).get_warmup_steps(steps) == expected
    assert RefArgs(warmup_steps=warmup).get_warmup_steps(steps) == expected


# ---------------------------------------------------------------- R1.11 setters

_SETTER_CALLS = [
    ("set_training", {}),
    (
        "set_training",
        {"learning_rate": 1e-3, "batch_size": 4, "num_epochs": 2, "activation_checkpointing": True},
    ),
    ("set_evaluate", {}),
    ("set_evaluate", {"strategy": "steps", "steps": 10, "delay": 3, "accumulation_steps": 2}),
    ("set_testing", {"batch_size": 2, "loss_only": True}),
    ("set_save", {}),
    ("set_save", {"strategy": "epoch", "total_limit": 2, "on_each_node": True}),
    ("set_logging", {}),
    ("set_logging", {"strategy": "epoch", "report_to": "tensorboard", "level": "info", "first_step": True}),
    ("set_push_to_hub", {"model_id": "me/model", "token": "secret", "strategy": "checkpoint"}),
    ("set_optimizer", {}),
    ("set_optimizer", {"name": "sgd", "learning_rate": 0.1, "args": "momentum=0.9"}),
    ("set_lr_scheduler", {"name": "cosine", "num_epochs": 1.5, "warmup_steps": 0.1}),
    ("set_dataloader", {"train_batch_size": 2, "num_workers": 2, "prefetch_factor": 4, "sampler_seed": 7}),
]


@pytest.mark.parametrize(
    ("method", "kwargs"), _SETTER_CALLS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(_SETTER_CALLS)]
)
def test_setters_match_reference(method: str, kwargs: dict) -> None:
    ours = getattr(TrainingArguments(use_cpu=True), method)(**kwargs)
    ref = getattr(RefArgs(use_cpu=True), method)(**kwargs)
    assert isinstance(ours, TrainingArguments)
    assert ours.to_dict() == ref.to_dict()
    if method == "set_push_to_hub":
        assert ours.hub_token == "secret"


@pytest.mark.parametrize("method", sorted({m for m, _ in _SETTER_CALLS}))
def test_setter_signatures_match_reference(method: str) -> None:
    import inspect

    def params(fn: object) -> list[tuple[str, object]]:
        return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]

    assert params(getattr(TrainingArguments, method)) == params(getattr(RefArgs, method))


def test_setter_quirks() -> None:
    assert TrainingArguments().set_logging().logging_nan_inf_filter is False
    assert TrainingArguments().set_evaluate().eval_delay is None  # [quirk] kept: delay=None stores None
    assert TrainingArguments().set_logging(report_to="wandb").report_to == "wandb"  # stored as given
    for cls in (TrainingArguments, RefArgs):
        with pytest.raises(ValueError):
            cls().set_evaluate(strategy="steps", steps=0)
        with pytest.raises(ValueError):
            cls().set_save(strategy="steps", steps=0)
        with pytest.raises(ValueError):
            cls().set_logging(strategy="steps", steps=0)
    with pytest.warns(FutureWarning):
        args = TrainingArguments().set_training(gradient_checkpointing=True)
    assert args.activation_checkpointing is True and args.gradient_checkpointing is True


# ---------------------------------------------------------------- R7.1 DeepSpeed at construction


def _reference_deepspeed_fill(config: dict, args: RefArgs) -> tuple[dict, list[str]]:
    """Run the reference's trainer_config_process on accelerate's config holder (deepspeed is not installed)."""
    from accelerate.utils.deepspeed import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    class Holder(HfDeepSpeedConfig):
        fill_match = HfTrainerDeepSpeedConfig.fill_match
        fill_only = HfTrainerDeepSpeedConfig.fill_only
        trainer_config_process = HfTrainerDeepSpeedConfig.trainer_config_process

    holder = Holder(config)
    holder.mismatches = []
    holder._dtype = None
    holder.trainer_config_process(args)
    return holder.config, holder.mismatches


_DS_AUTO = {
    "train_micro_batch_size_per_gpu": "auto",
    "train_batch_size": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
    },
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto"}},
    "fp16": {"enabled": "auto"},
    "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"},
}
_DS_ARGS = {
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 3,
    "learning_rate": 3e-4,
    "weight_decay": 0.1,
    "max_grad_norm": 0.7,
    "adam_beta2": 0.95,
    "warmup_steps": 0.1,
    "use_cpu": True,
}


def test_deepspeed_auto_filling_matches_reference(tmp_path) -> None:
    user_config = json.loads(json.dumps(_DS_AUTO))
    args = TrainingArguments(deepspeed=user_config, save_on_each_node=True, **_DS_ARGS)
    assert user_config == _DS_AUTO  # the user's dict is not modified
    assert args.deepspeed is user_config
    config = args.hf_deepspeed_config
    assert (config["train_micro_batch_size_per_gpu"], config["train_batch_size"]) == (4, 12)
    assert (config["gradient_accumulation_steps"], config["gradient_clipping"]) == (3, 0.7)
    assert config["optimizer"]["params"]["betas"] == [0.9, 0.95]
    assert config["scheduler"]["params"] == {"warmup_min_lr": 0, "warmup_max_lr": 3e-4}
    assert config["checkpoint"] == {"use_node_local_storage": True}
    assert config["zero_optimization"]["reduce_bucket_size"] == "auto"  # filled at train start
    assert args.deepspeed_mismatches == []
    ref_args = _quiet(RefArgs, save_on_each_node=True, **_DS_ARGS)
    ref_config, ref_mismatches = _reference_deepspeed_fill(_DS_AUTO, ref_args)
    assert config == ref_config and ref_mismatches == []
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(_DS_AUTO))
    assert (
        TrainingArguments(deepspeed=str(path), save_on_each_node=True, **_DS_ARGS).hf_deepspeed_config
        == config
    )


def test_deepspeed_mismatches_recorded_and_zero_section_required() -> None:
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"params": {"lr": 1e-3}},
        "zero_optimization": {},
    }
    args = TrainingArguments(deepspeed=config, per_device_train_batch_size=4, use_cpu=True)
    _, ref_mismatches = _reference_deepspeed_fill(
        config, RefArgs(per_device_train_batch_size=4, use_cpu=True)
    )
    assert args.deepspeed_mismatches == ref_mismatches
    assert len(args.deepspeed_mismatches) == 2
    assert "train_micro_batch_size_per_gpu=2" in args.deepspeed_mismatches[0]
    assert "learning_rate=5e-05" in args.deepspeed_mismatches[1]
    with pytest.raises(ValueError, match="zero_optimization"):
        TrainingArguments(deepspeed={"train_batch_size": "auto"})
    assert TrainingArguments().hf_deepspeed_config is None


# ---------------------------------------------------------------- conversion


def test_as_training_arguments_from_transformers_keeps_token() -> None:
    ref = _quiet(
        RefArgs,
        hub_token="secret",
        eval_strategy="steps",
        eval_steps=10,
        report_to="tensorboard",
        debug="underflow_overflow",
        fsdp="full_shard",
        accelerator_config={"even_batches": False},
        use_cpu=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = as_training_arguments(ref)
    assert type(ours) is TrainingArguments
    assert ours.hub_token == "secret"
    assert ours.to_dict()["hub_token"] == "<HUB_TOKEN>"
    assert ours.to_dict() == ref.to_dict()
    assert ours.fsdp_plugin_args == ref.fsdp_plugin_args
    assert as_training_arguments(ours) is ours


def test_as_training_arguments_seq2seq_and_dict() -> None:
    ref = RefSeq2SeqArgs(predict_with_generate=True, generation_num_beams=3, use_cpu=True)
    ours = as_training_arguments(ref)
    assert type(ours) is Seq2SeqTrainingArguments
    assert ours.to_dict() == ref.to_dict()
    from_dict = as_training_arguments(RefArgs(hub_token="secret", seed=3).to_dict())
    assert type(from_dict) is TrainingArguments and from_dict.seed == 3
    assert from_dict.hub_token is None  # the "<HUB_TOKEN>" placeholder is not a token
    assert type(as_training_arguments(ref.to_dict())) is Seq2SeqTrainingArguments
    with pytest.raises(ValueError, match="args"):
        as_training_arguments(42)


def test_main_process_first_orders_two_processes(tmp_path) -> None:
    """R1.10: in a two-process gloo run the main process runs the body strictly first."""
    import torch.multiprocessing as mp

    out = tmp_path / "order.txt"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(_main_first_worker, args=(2, str(tmp_path), port), nprocs=2, start_method="fork")
    entries = [line.split(":") for line in out.read_text().split()]
    assert [int(rank) for rank, _ in entries] == [0, 1]
    assert float(entries[0][1]) < float(entries[1][1])


def _main_first_worker(rank: int, world_size: int, folder: str, port: int) -> None:
    import os
    import time

    import torch.distributed as dist

    os.environ.update(
        {
            "WORLD_SIZE": str(world_size),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        args = TrainingArguments(use_cpu=True)
        if rank == 0:
            time.sleep(0.3)  # the replica must still wait for us
        with args.main_process_first(desc="write"):
            with open(os.path.join(folder, "order.txt"), "a") as f:
                f.write(f"{rank}:{time.time()}\n")
    finally:
        dist.destroy_process_group()
