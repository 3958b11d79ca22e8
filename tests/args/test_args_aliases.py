"""v4-era keyword aliases of TrainingArguments (R1.5)."""

from __future__ import annotations

import dataclasses
import json
import os
import warnings

import pytest
from transformers import TrainingArguments as RefArgs

from hf_lightning.args.aliases import V4_ALIASES
from hf_lightning.args.training_args import Seq2SeqTrainingArguments, TrainingArguments


def _build(**kwargs: object) -> TrainingArguments:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TrainingArguments(**kwargs)


# alias kwargs -> equivalent v5 kwargs
_TRANSLATIONS = {
    "evaluation_strategy": ({"evaluation_strategy": "steps"}, {"eval_strategy": "steps"}),
    "per_gpu_train_batch_size": ({"per_gpu_train_batch_size": 4}, {"per_device_train_batch_size": 4}),
    "per_gpu_eval_batch_size": ({"per_gpu_eval_batch_size": 5}, {"per_device_eval_batch_size": 5}),
    "warmup_ratio": ({"warmup_ratio": 0.1}, {"warmup_steps": 0.1}),
    "logging_dir": ({"logging_dir": "runs/x"}, {}),
    "no_cuda": ({"no_cuda": True}, {"use_cpu": True}),
    "use_mps_device": ({"use_mps_device": False}, {}),
    "fp16_opt_level": ({"fp16_opt_level": "O1"}, {}),
    "half_precision_backend": ({"half_precision_backend": "cuda_amp"}, {}),
    "fp16_backend": ({"fp16_backend": "cpu_amp"}, {}),
    "xpu_backend": ({"xpu_backend": "ccl"}, {"ddp_backend": "ccl"}),
    "tpu_num_cores": ({"tpu_num_cores": 8}, {}),
    "tpu_metrics_debug": ({"tpu_metrics_debug": True}, {"debug": "tpu_metrics_debug"}),
    "past_index": ({"past_index": -1}, {}),
    "sharded_ddp": ({"sharded_ddp": ""}, {}),
    "fsdp_min_num_params": (
        {"fsdp_min_num_params": 1000, "fsdp": True},
        {"fsdp": True, "fsdp_config": {"min_num_params": 1000, "auto_wrap_policy": "SIZE_BASED_WRAP"}},
    ),
    "fsdp_transformer_layer_cls_to_wrap": (
        {"fsdp_transformer_layer_cls_to_wrap": "BertLayer"},
        {"fsdp_config": {"transformer_layer_cls_to_wrap": ["BertLayer"]}},
    ),
    "adafactor": ({"adafactor": True}, {"optim": "adafactor"}),
    "group_by_length": ({"group_by_length": True}, {"train_sampling_strategy": "group_by_length"}),
    "overwrite_output_dir": ({"overwrite_output_dir": True}, {}),
    "push_to_hub_model_id": (
        {"push_to_hub_model_id": "model", "push_to_hub_organization": "org"},
        {"hub_model_id": "org/model"},
    ),
    "push_to_hub_organization": (
        {"push_to_hub_organization": "org", "output_dir": "out/run1"},
        {"hub_model_id": "org/run1", "output_dir": "out/run1"},
    ),
    "push_to_hub_token": ({"push_to_hub_token": "tok"}, {"hub_token": "tok"}),
    "include_inputs_for_metrics": ({"include_inputs_for_metrics": True}, {"include_for_metrics": ["inputs"]}),
    "use_legacy_prediction_loop": ({"use_legacy_prediction_loop": False}, {}),
    "mp_parameters": ({"mp_parameters": ""}, {}),
    "torchdynamo": ({"torchdynamo": "eager"}, {"torch_compile_backend": "eager"}),
    "ray_scope": ({"ray_scope": "last"}, {}),
    "jit_mode_eval": ({"jit_mode_eval": False}, {}),
    "use_ipex": ({"use_ipex": False}, {}),
    "save_safetensors": ({"save_safetensors": True}, {}),
    "include_tokens_per_second": (
        {"include_tokens_per_second": True},
        {"include_num_input_tokens_seen": "all"},
    ),
    "split_batches": ({"split_batches": True}, {"accelerator_config": {"split_batches": True}}),
    "dispatch_batches": ({"dispatch_batches": False}, {"accelerator_config": {"dispatch_batches": False}}),
}


def test_every_alias_has_a_translation_case() -> None:
    assert set(_TRANSLATIONS) == set(V4_ALIASES)


@pytest.mark.parametrize(("alias_kwargs", "v5_kwargs"), list(_TRANSLATIONS.values()), ids=list(_TRANSLATIONS))
def test_alias_equals_v5_spelling(alias_kwargs: dict, v5_kwargs: dict) -> None:
    with pytest.warns(FutureWarning):
        ours = TrainingArguments(**alias_kwargs)
    expected = _build(**v5_kwargs)
    assert ours.to_dict() == expected.to_dict()
    assert not set(V4_ALIASES) & set(ours.to_dict())
    # The reference builds the same v5 spelling to the same dict (the v5 side is real reference behaviour).
    # Not for ddp_backend: the reference opens a process group for it at construction, impossible here.
    if "ddp_backend" not in v5_kwargs:
        assert expected.to_dict() == _reference(**v5_kwargs).to_dict()


def _reference(**kwargs: object) -> RefArgs:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return RefArgs(**kwargs)


@pytest.mark.parametrize("alias", sorted(V4_ALIASES))
def test_reference_rejects_removed_names(alias: str) -> None:
    # Confirms the "removed" column: transformers 5.24 has no such keyword.
    with pytest.raises(TypeError):
        RefArgs(**{alias: _TRANSLATIONS[alias][0][alias]})
    assert alias not in {f.name for f in dataclasses.fields(TrainingArguments)}


_CONFLICTS = {
    "evaluation_strategy": {"evaluation_strategy": "steps", "eval_strategy": "epoch"},
    "per_gpu_train_batch_size": {"per_gpu_train_batch_size": 4, "per_device_train_batch_size": 8},
    "per_gpu_eval_batch_size": {"per_gpu_eval_batch_size": 4, "per_device_eval_batch_size": 2},
    "warmup_ratio": {"warmup_ratio": 0.1, "warmup_steps": 5},
    "no_cuda": {"no_cuda": True, "use_cpu": False},
    "xpu_backend": {"xpu_backend": "ccl", "ddp_backend": "gloo"},
    "fsdp_min_num_params": {"fsdp_min_num_params": 5, "fsdp_config": {"fsdp_min_num_params": 3}},
    "fsdp_min_num_params_policy": {"fsdp_min_num_params": 5, "fsdp_config": {"auto_wrap_policy": "NO_WRAP"}},
    "fsdp_transformer_layer_cls_to_wrap": {
        "fsdp_transformer_layer_cls_to_wrap": "BertLayer",
        "fsdp_config": {"transformer_layer_cls_to_wrap": ["GPT2Block"]},
    },
    "adafactor": {"adafactor": True, "optim": "sgd"},
    "group_by_length": {"group_by_length": True, "train_sampling_strategy": "sequential"},
    "push_to_hub_model_id": {"push_to_hub_model_id": "m", "hub_model_id": "other"},
    "push_to_hub_token": {"push_to_hub_token": "a", "hub_token": "b"},
    "torchdynamo": {"torchdynamo": "eager", "torch_compile_backend": "inductor"},
    "split_batches": {"split_batches": True, "accelerator_config": {"split_batches": False}},
    "dispatch_batches": {"dispatch_batches": True, "accelerator_config": '{"dispatch_batches": "false"}'},
}


@pytest.mark.parametrize("kwargs", list(_CONFLICTS.values()), ids=list(_CONFLICTS))
def test_conflicting_alias_and_replacement(kwargs: dict) -> None:
    alias = next(name for name in kwargs if name in V4_ALIASES)
    with pytest.raises(ValueError, match=alias):
        _build(**kwargs)


def test_agreeing_alias_and_replacement_is_accepted() -> None:
    args = _build(evaluation_strategy="steps", eval_strategy="steps", no_cuda=True, use_cpu=True)
    assert args.eval_strategy == "steps" and args.use_cpu is True
    # A v4 default value means "not set", so it never conflicts (v4 to_dict() dumps hold every default).
    assert _build(evaluation_strategy="no", eval_strategy="epoch").eval_strategy == "epoch"
    assert _build(warmup_ratio=0.0, warmup_steps=5).warmup_steps == 5
    assert _build(warmup_ratio=0.2, warmup_steps=0).warmup_steps == 0.2


_REFUSED = {
    "use_mps_device": ({"use_mps_device": True}, "use_mps_device"),
    "fp16_opt_level": ({"fp16_opt_level": "O2"}, "fp16_opt_level"),
    "half_precision_backend_apex": ({"half_precision_backend": "apex"}, "half_precision_backend"),
    "fp16_backend_apex": ({"fp16_backend": "apex"}, "fp16_backend"),
    "past_index": ({"past_index": 0}, "past_index"),
    "sharded_ddp": ({"sharded_ddp": "zero_dp_2"}, "fsdp=True"),
    "use_legacy_prediction_loop": ({"use_legacy_prediction_loop": True}, "use_legacy_prediction_loop"),
    "mp_parameters": ({"mp_parameters": "x=1"}, "mp_parameters"),
    "jit_mode_eval": ({"jit_mode_eval": True}, "torch_compile"),
    "use_ipex": ({"use_ipex": True}, "use_ipex"),
    "save_safetensors": ({"save_safetensors": False}, "save_safetensors"),
    "warmup_ratio_out_of_range": ({"warmup_ratio": 1.5}, "warmup_steps"),
    "report_to_none": ({"report_to": None}, '"none"'),
}


@pytest.mark.parametrize(("kwargs", "fix"), list(_REFUSED.values()), ids=list(_REFUSED))
def test_refused_values(kwargs: dict, fix: str) -> None:
    with pytest.raises(ValueError) as error:
        _build(**kwargs)
    assert next(iter(kwargs)) in str(error.value) and fix in str(error.value)


def test_report_to_none_fails_later_in_reference() -> None:
    # v5 keeps [None] and only fails when the Trainer is built; we refuse at construction.
    assert RefArgs(report_to=None).report_to == [None]


def test_removed_optimizer_values() -> None:
    with pytest.raises(ValueError):
        RefArgs(optim="adamw_hf")
    with pytest.warns(FutureWarning, match="adamw_hf"):
        assert TrainingArguments(optim="adamw_hf").optim == "adamw_torch"
    with pytest.warns(FutureWarning, match="adamw_apex_fused"):
        assert TrainingArguments(optim="adamw_apex_fused").optim == "adamw_torch_fused"


def test_attribute_aliases() -> None:
    args = _build(logging_dir="~/tb")
    assert args.logging_dir == os.path.expanduser("~/tb")
    assert TrainingArguments().logging_dir is None
    full = _build(warmup_ratio=1.0)
    assert full.warmup_steps == 0 and full.warmup_ratio == 1.0
    assert (
        full.get_warmup_steps(33) == 33
    )  # v5 reads warmup_steps=1.0 as one step, so this stays an attribute
    full.warmup_steps = 5
    assert full.get_warmup_steps(33) == 5


def test_ray_scope_sets_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Set, then deleted: monkeypatch records the variable's first state and puts it back after the test (a bare
    # delenv of an absent variable records nothing, and the RAY_SCOPE the alias sets would reach later tests).
    monkeypatch.setenv("RAY_SCOPE", "last")
    monkeypatch.delenv("RAY_SCOPE")
    _build(ray_scope="all")
    assert os.environ["RAY_SCOPE"] == "all"


def test_alias_merges_into_existing_configs(tmp_path) -> None:
    path = tmp_path / "fsdp.json"
    path.write_text(json.dumps({"cpu_offload": True}))
    args = _build(fsdp=True, fsdp_config=str(path), fsdp_min_num_params=10)
    assert args.fsdp_plugin_args["min_num_params"] == 10 and args.fsdp_plugin_args["cpu_offload"] is True
    args = _build(split_batches=True, accelerator_config='{"even_batches": "false"}')
    assert args.accelerator_config.split_batches is True and args.accelerator_config.even_batches is False
    args = _build(tpu_metrics_debug=True, debug="underflow_overflow")
    assert [d.value for d in args.debug] == ["underflow_overflow", "tpu_metrics_debug"]
    args = _build(include_inputs_for_metrics=True, include_for_metrics=["loss"])
    assert args.include_for_metrics == ["loss", "inputs"]
    args = _build(include_tokens_per_second=True, include_num_input_tokens_seen="non_padding")
    assert args.include_num_input_tokens_seen == "non_padding"


def test_v4_dump_with_defaults_builds_defaults() -> None:
    """A v4 to_dict() dump carries every removed name at its default: all are warning-only."""
    v4_defaults = {
        "evaluation_strategy": "no",
        "per_gpu_train_batch_size": None,
        "warmup_ratio": 0.0,
        "no_cuda": False,
        "use_mps_device": False,
        "fp16_opt_level": "O1",
        "half_precision_backend": "auto",
        "xpu_backend": None,
        "tpu_num_cores": None,
        "tpu_metrics_debug": False,
        "past_index": -1,
        "sharded_ddp": [],
        "fsdp_min_num_params": 0,
        "fsdp_transformer_layer_cls_to_wrap": None,
        "adafactor": False,
        "group_by_length": False,
        "push_to_hub_model_id": None,
        "push_to_hub_organization": None,
        "push_to_hub_token": "<PUSH_TO_HUB_TOKEN>",
        "include_inputs_for_metrics": False,
        "use_legacy_prediction_loop": False,
        "mp_parameters": "",
        "torchdynamo": None,
        "ray_scope": "last",
        "jit_mode_eval": False,
        "use_ipex": False,
        "save_safetensors": True,
        "include_tokens_per_second": False,
        "split_batches": None,
        "dispatch_batches": None,
    }
    with pytest.warns(FutureWarning):
        args = TrainingArguments(**v4_defaults)
    assert args.to_dict() == TrainingArguments().to_dict()
    assert args.hub_token is None


def test_seq2seq_accepts_aliases_and_positional_output_dir() -> None:
    with pytest.warns(FutureWarning, match="evaluation_strategy"):
        args = Seq2SeqTrainingArguments("out", evaluation_strategy="epoch", predict_with_generate=True)
    assert args.output_dir == "out" and args.eval_strategy == "epoch" and args.predict_with_generate
    with pytest.raises(TypeError):
        TrainingArguments("a", output_dir="b")
    with pytest.raises(TypeError):
        TrainingArguments(not_a_field=1)
