"""Every invalid value is refused when the arguments are built, in one error naming each field and its fix.

Each case also builds the reference's arguments: where the reference raises there too, ours is an instance of
its exception type; where it accepts the value, the value fails later in its `train()` (tests/engine/
test_invalid_inputs.py runs the reference's training on the cases that need the model or the data).
"""

from __future__ import annotations

import json
import os
import warnings

import pytest
import transformers

from hf_lightning.args.training_args import TrainingArguments
from hf_lightning.args.validation import InvalidArgumentsError

# (case id, keyword arguments, the field the message must name)
CASES: list[tuple[str, dict, str]] = [
    ("log_level unknown", {"log_level": "loud"}, "log_level"),
    ("log_level_replica unknown", {"log_level_replica": "loud"}, "log_level_replica"),
    ("gradient_accumulation_steps=0", {"gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
    ("gradient_accumulation_steps=1.5", {"gradient_accumulation_steps": 1.5}, "gradient_accumulation_steps"),
    ("per_device_train_batch_size=0", {"per_device_train_batch_size": 0}, "per_device_train_batch_size"),
    ("per_device_train_batch_size=2.5", {"per_device_train_batch_size": 2.5}, "per_device_train_batch_size"),
    ("per_device_eval_batch_size=0", {"per_device_eval_batch_size": 0}, "per_device_eval_batch_size"),
    ("seed=-1", {"seed": -1}, "seed"),
    ("seed=2**32", {"seed": 2**32}, "seed"),
    ("data_seed=-5", {"data_seed": -5}, "data_seed"),
    ("seed as str", {"seed": "42"}, "seed"),
    ("adam_beta1=1", {"adam_beta1": 1.0}, "adam_beta1"),
    ("adam_beta1=-0.1", {"adam_beta1": -0.1}, "adam_beta1"),
    ("adam_beta2=1", {"adam_beta2": 1.0}, "adam_beta2"),
    ("adam_epsilon<0", {"adam_epsilon": -1e-8}, "adam_epsilon"),
    ("learning_rate='fast'", {"learning_rate": "fast"}, "learning_rate"),
    ("learning_rate='5e-5' (YAML)", {"learning_rate": "5e-5"}, "learning_rate"),
    ("learning_rate<0", {"learning_rate": -1.0}, "learning_rate"),
    ("learning_rate nan", {"learning_rate": float("nan")}, "learning_rate"),
    ("weight_decay<0", {"weight_decay": -0.1}, "weight_decay"),
    ("label_smoothing_factor>1", {"label_smoothing_factor": 1.5}, "label_smoothing_factor"),
    ("prefetch without workers", {"dataloader_prefetch_factor": 2}, "dataloader_prefetch_factor"),
    ("prefetch factor 0", {"dataloader_num_workers": 1, "dataloader_prefetch_factor": 0}, "dataloader_prefetch_factor"),
    ("unknown context", {"dataloader_num_workers": 1, "dataloader_multiprocessing_context": "thread"}, "dataloader_multiprocessing_context"),
    ("num_workers<0", {"dataloader_num_workers": -1}, "dataloader_num_workers"),
    ("output_dir empty", {"output_dir": ""}, "output_dir"),
    ("unknown torch_compile_backend", {"torch_compile_backend": "nope"}, "torch_compile_backend"),
    ("unknown torch_compile_mode", {"torch_compile_mode": "fastest"}, "torch_compile_mode"),
    ("unknown ddp_backend", {"ddp_backend": "nope"}, "ddp_backend"),
    ("ddp_timeout<0", {"ddp_timeout": -1}, "ddp_timeout"),
    ("ddp_bucket_cap_mb=0", {"ddp_bucket_cap_mb": 0}, "ddp_bucket_cap_mb"),
    ("num_train_epochs=-1", {"num_train_epochs": -1}, "num_train_epochs"),
    ("num_train_epochs as str", {"num_train_epochs": "3"}, "num_train_epochs"),
    ("max_steps=0", {"max_steps": 0}, "max_steps"),
    ("max_steps=2.5", {"max_steps": 2.5}, "max_steps"),
    ("logging_steps<0", {"logging_steps": -1}, "logging_steps"),
    ("save_steps<0", {"save_steps": -5}, "save_steps"),
    ("eval_steps<0", {"eval_strategy": "steps", "eval_steps": -1}, "eval_steps"),
    ("eval_accumulation_steps=0", {"eval_accumulation_steps": 0}, "eval_accumulation_steps"),
    ("neftune_noise_alpha<0", {"neftune_noise_alpha": -1.0}, "neftune_noise_alpha"),
    ("unknown train_sampling_strategy", {"train_sampling_strategy": "shuffled"}, "train_sampling_strategy"),
    ("unknown include_for_metrics", {"include_for_metrics": ["logits"]}, "include_for_metrics"),
    ("unknown include_num_input_tokens_seen", {"include_num_input_tokens_seen": "some"}, "include_num_input_tokens_seen"),
    ("label_names a str", {"label_names": "labels"}, "label_names"),
    ("fp16 a str", {"fp16": "no"}, "fp16"),
    ("disable_tqdm a str", {"disable_tqdm": "yes"}, "disable_tqdm"),
    ("report_to an int", {"report_to": 5}, "report_to"),
    ("optim_args an int", {"optim_args": 5}, "optim_args"),
    ("run_name an int", {"run_name": 5}, "run_name"),
    ("metric_for_best_model an int", {"metric_for_best_model": 5}, "metric_for_best_model"),
    # Checked by the reference's own rules at construction (kept, with the reference's type).
    ("warmup_steps<0", {"warmup_steps": -1}, "warmup_steps"),
    ("torch_empty_cache_steps=0", {"torch_empty_cache_steps": 0}, "torch_empty_cache_steps"),
    ("unknown debug option", {"debug": "nope"}, "debug"),
    ("unknown eval_strategy", {"eval_strategy": "sometimes"}, "eval_strategy"),
    # Text that is no JSON object: the reference keeps it and its train() fails on `**"text"` (TypeError).
    ("lr_scheduler_kwargs text not JSON", {"lr_scheduler_kwargs": "num_cycles=2"}, "lr_scheduler_kwargs"),
    ("lr_scheduler_kwargs bad JSON", {"lr_scheduler_kwargs": '{"num_cycles": '}, "lr_scheduler_kwargs"),
]

# The reference fails on these at construction with an exception its code does not mean to raise (an int has
# no `endswith`): we raise our ValueError naming the field instead (docs/divergences.md).
_REFERENCE_CRASHES = {
    "metric_for_best_model an int": AttributeError,
    "lr_scheduler_kwargs bad JSON": json.JSONDecodeError,  # json's error, naming no field
}


def _build(cls: type, kwargs: dict, tmp_path) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(**{"output_dir": str(tmp_path / "out"), "use_cpu": True, "report_to": "none", **kwargs})


def _reference_error(kwargs: dict, tmp_path) -> BaseException | None:
    try:
        _build(transformers.TrainingArguments, kwargs, tmp_path)
    except Exception as error:  # noqa: BLE001 - whatever the reference raises is what we compare with
        return error
    return None


@pytest.mark.parametrize(("case", "kwargs", "field"), CASES, ids=[c[0] for c in CASES])
def test_invalid_value_is_refused_at_construction_naming_the_field(case, kwargs, field, tmp_path):
    with pytest.raises(ValueError) as info:
        _build(TrainingArguments, kwargs, tmp_path)
    message = str(info.value)
    assert field in message
    if isinstance(info.value, InvalidArgumentsError):
        assert field in info.value.fields
        assert f"  - {field}: " in message
    reference = _reference_error(kwargs, tmp_path)
    if case in _REFERENCE_CRASHES:
        assert isinstance(reference, _REFERENCE_CRASHES[case])
    elif reference is not None:
        assert isinstance(info.value, type(reference)), (case, reference)


def test_all_problems_of_one_object_in_one_error(tmp_path):
    with pytest.raises(InvalidArgumentsError) as info:
        _build(
            TrainingArguments,
            {
                "learning_rate": "fast",
                "gradient_accumulation_steps": 0,
                "seed": -1,
                "num_train_epochs": -2,
                "log_level": "loud",
            },
            tmp_path,
        )
    assert info.value.fields == [
        "learning_rate",
        "gradient_accumulation_steps",
        "seed",
        "log_level",
        "num_train_epochs",
    ]
    assert isinstance(info.value, TypeError)  # a wrong type is a TypeError too
    assert isinstance(info.value, KeyError)  # an unknown log level is the reference's KeyError too


def test_messages_carry_the_fix(tmp_path):
    def message(**kwargs) -> str:
        with pytest.raises(ValueError) as info:
            _build(TrainingArguments, kwargs, tmp_path)
        return str(info.value)

    assert "learning_rate=5e-05" in message(learning_rate="5e-5")  # the number to write instead
    assert "label_names=['labels']" in message(label_names="labels")
    assert "max_steps=2" in message(max_steps=2.0)
    assert "'debug', 'info'" in message(log_level="loud")
    assert "max_steps" in message(num_train_epochs=-1)


def test_a_token_value_is_never_shown(tmp_path):
    with pytest.raises(InvalidArgumentsError) as info:
        _build(TrainingArguments, {"hub_token": 123456789}, tmp_path)
    assert "hub_token" in str(info.value) and "123456789" not in str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"learning_rate": 1},  # an int for a float
        {"num_train_epochs": 2},
        {"output_dir": None},
        {"label_names": ("labels",)},  # a tuple for a list
        {"max_steps": 5},
        {"dataloader_num_workers": 2, "dataloader_persistent_workers": True, "dataloader_prefetch_factor": 2},
        {"num_train_epochs": -1, "max_steps": 3},  # epochs unused when max_steps is set
        {"num_train_epochs": 0},
        {"max_steps": -5},
        {"include_num_input_tokens_seen": True},
        {"debug": ["underflow_overflow"]},
        {"fsdp": ""},
        {"save_total_limit": 0},
        {"max_grad_norm": 0.0},
        {"torch_compile_backend": "eager"},
        {"lr_scheduler_kwargs": '{"num_cycles": 2}', "lr_scheduler_type": "cosine"},
        {"accelerator_config": {"split_batches": True}},
    ],
)
def test_valid_values_still_build(kwargs, tmp_path):
    _build(TrainingArguments, kwargs, tmp_path)
    _build(transformers.TrainingArguments, kwargs, tmp_path)


def test_path_objects_are_accepted(tmp_path):
    args = _build(TrainingArguments, {"output_dir": tmp_path / "out"}, tmp_path)
    assert os.fspath(args.output_dir) == str(tmp_path / "out")


def test_numpy_numbers_are_numbers(tmp_path):
    import numpy as np

    args = _build(TrainingArguments, {"learning_rate": np.float32(1e-3), "seed": np.int64(3)}, tmp_path)
    assert args.seed == 3
