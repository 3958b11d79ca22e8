"""Random combinations of fields and values from the field catalogue: each is refused with an error naming a
field drawn, or trains (a tiny model, two steps) without an error that names no field.

Hypothesis draws 1-3 fields of `TrainingArguments` and, for each, a value among its default, values of its type
(valid and out of range) and values of other types. `derandomize=True` and a fixed `max_examples` make the
draws the same on every run, so CI is deterministic and bounded.
"""

from __future__ import annotations

import dataclasses
import math
import typing
import warnings

import transformers
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hf_lightning.args.training_args import TrainingArguments
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.models import make_regression_mlp, regression_data

# Fields left out of the draws: they reach outside the test process (hub, trackers, process layout, files),
# change process-wide state other tests see (log levels, deterministic algorithms), compile (seconds per draw)
# or need a GPU; each has its own tests.
_LEFT_OUT = {
    "output_dir", "use_cpu", "report_to", "run_name", "project", "trackio_space_id", "trackio_bucket_id",
    "trackio_static_space_id", "push_to_hub", "hub_token", "hub_private_repo", "hub_model_id", "hub_strategy",
    "hub_always_push", "hub_revision", "log_level", "log_level_replica", "full_determinism", "local_rank",
    "torch_compile", "torch_compile_backend", "torch_compile_mode", "deepspeed", "fsdp", "fsdp_config",
    "accelerator_config", "parallelism_config", "resume_from_checkpoint", "use_liger_kernel", "liger_kernel_config",
    "optim_target_modules", "dataloader_num_workers", "auto_find_batch_size",
}  # fmt: skip

# Values of other types, drawn for every field.
_FOREIGN = ["x", -1, 2.5, True, None, ["x"]]

_BY_TYPE: dict[typing.Any, list] = {
    bool: [True, False],
    int: [-1, 0, 1, 3, 2**40],
    float: [-1.0, 0.0, 0.5, 1.0, 3.0, math.nan],
    str: ["", "x"],
}

# Values a field's type alone would not suggest (names of its closed set, valid and not).
_SPECIAL: dict[str, list] = {
    "optim": ["adamw_torch", "sgd", "adafactor", "adamw_8bit", "rmsprop"],
    "lr_scheduler_type": ["linear", "cosine", "constant", "reduce_lr_on_plateau", "cosine_with_min_lr", "nope"],
    "lr_scheduler_kwargs": [{}, {"foo": 1}, '{"num_cycles": 1}', {"min_lr": 1e-6}],
    "eval_strategy": ["no", "steps", "epoch"],
    "logging_strategy": ["no", "steps", "epoch"],
    "save_strategy": ["no", "steps", "epoch", "best"],
    "train_sampling_strategy": ["random", "sequential", "group_by_length"],
    "include_num_input_tokens_seen": ["all", "no", "non_padding"],
    "include_for_metrics": [[], ["inputs"], ["loss"]],
    "label_names": [["labels"], ["y"]],
    "debug": ["", "underflow_overflow"],
    "dataloader_multiprocessing_context": ["spawn"],
    "metric_for_best_model": ["loss", "eval_loss", "accuracy"],
    "optim_args": ["", "foo=1"],
    "max_steps": [-1, 0, 1, 2],
    "num_train_epochs": [-1, 0, 0.5, 1],
    "per_device_train_batch_size": [0, 1, 4],
    "gradient_accumulation_steps": [0, 1, 2],
    "eval_steps": [None, 1, 0.5],
    "save_steps": [1, 0.5],
    "logging_steps": [0, 1, 0.5],
}

_HINTS = typing.get_type_hints(TrainingArguments)
_FIELDS = [f for f in dataclasses.fields(TrainingArguments) if f.init and f.name not in _LEFT_OUT]
FIELD_NAMES = [f.name for f in _FIELDS]
_ALL_FIELD_NAMES = {f.name for f in dataclasses.fields(TrainingArguments)}


def _typed_values(annotation: typing.Any) -> list:
    values: list = []
    for arg in typing.get_args(annotation) or (annotation,):
        values += _BY_TYPE.get(arg, [])
    return values


def _candidates(field: dataclasses.Field) -> list:
    default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
    values = [default, *_SPECIAL.get(field.name, []), *_typed_values(_HINTS[field.name]), *_FOREIGN]
    unique: list = []
    for value in values:
        if not any(type(value) is type(seen) and (value == seen or value != value) for seen in unique):
            unique.append(value)
    return unique


_CANDIDATES = {f.name: _candidates(f) for f in _FIELDS}


@st.composite
def drawn_fields(draw) -> dict:
    names = draw(st.lists(st.sampled_from(FIELD_NAMES), min_size=1, max_size=3, unique=True))
    return {name: draw(st.sampled_from(_CANDIDATES[name])) for name in names}


def _names_a_field(error: BaseException, names) -> bool:
    return any(name in str(error) for name in names)


@settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(fields=drawn_fields())
def test_random_arguments_are_refused_naming_a_drawn_field_or_train(fields, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("random"))
    base = {"output_dir": out, "use_cpu": True, "report_to": "none", "max_steps": 2, "save_strategy": "no",
            "per_device_train_batch_size": 4, "disable_tqdm": True}  # fmt: skip
    previous = transformers.logging.get_verbosity()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            args = TrainingArguments(**{**base, **fields})
        except Exception as error:  # noqa: BLE001 - any refusal must name a drawn field
            assert _names_a_field(error, fields), f"{fields}: {type(error).__name__}: {error}"
            event("refused by the arguments")
            return
        try:
            trainer = HFLightningTrainer(
                model=make_regression_mlp(), args=args, train_dataset=regression_data(8), eval_dataset=regression_data(4)
            )
        except Exception as error:  # noqa: BLE001
            assert _names_a_field(error, fields), f"{fields}: {type(error).__name__}: {error}"
            event("refused by the trainer")
            return
        try:
            trainer.train()
            event("trained")
        except Exception as error:  # noqa: BLE001 - a failure inside train() must still name a field
            assert _names_a_field(error, _ALL_FIELD_NAMES), f"{fields}: {type(error).__name__}: {error}"
            event("failed in train() naming a field")
        finally:
            transformers.logging.set_verbosity(previous)


def test_the_left_out_fields_exist():
    assert _LEFT_OUT <= _ALL_FIELD_NAMES and len(FIELD_NAMES) > 70
