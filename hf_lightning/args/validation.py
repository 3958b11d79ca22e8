"""Our checks of every argument value (the schema): the type of every field against its annotation, the ranges,
the closed sets of choices and the combinations the reference leaves to torch, numpy or its loop to fail on deep
inside `train()` (one function per family).

`check_values` runs first, on the values as given. Every problem of one object is gathered into one
`InvalidArgumentsError` (a `ValueError`, and also the type the reference raises for it: `TypeError` for a wrong
type, `KeyError` for an unknown log level), as the translation's refusal gathers the refused fields. The reference's
own rules are `args/reference_rules.py`.
"""

from __future__ import annotations

import json
import numbers
import os
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from enum import Enum
from functools import cache
from typing import Any

__all__ = [
    "InvalidArgumentsError",
    "Problem",
    "check_choices",
    "check_combinations",
    "check_field_types",
    "check_loader_combinations",
    "check_ranges",
    "check_values",
    "invalid_arguments",
    "value_problems",
]

# ----------------------------------------------------------------------------- value checks (ours)


@dataclass(frozen=True)
class Problem:
    """One invalid value: the field it concerns, what is wrong with it with the fix, and the exception type
    the value meets in the reference (``TypeError`` for a wrong type, ``KeyError`` for an unknown log level)."""

    field: str
    message: str
    kind: type[Exception] = ValueError


class InvalidArgumentsError(ValueError):
    """Every invalid value of one arguments object, one line each; ``fields`` names them in order.

    Raised through ``invalid_arguments``, which makes it an instance of each problem's ``kind`` as well, so
    that an ``except`` written for the reference's exception still catches it.
    """

    def __init__(self, owner: str, problems: list[Problem]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {problem.field}: {problem.message}" for problem in self.problems)
        super().__init__(f"{owner} has invalid values:\n{lines}")

    def __str__(self) -> str:
        return str(self.args[0])  # not KeyError's quoted repr

    @property
    def fields(self) -> list[str]:
        """The fields named, in the order of the message."""
        return [problem.field for problem in self.problems]


@cache
def _error_class(kinds: tuple[type[Exception], ...]) -> type[InvalidArgumentsError]:
    if not kinds:
        return InvalidArgumentsError
    return type("InvalidArgumentsError", (InvalidArgumentsError, *kinds), {"__module__": __name__})


def invalid_arguments(owner: str, problems: list[Problem]) -> InvalidArgumentsError:
    """The error listing ``problems``, also an instance of every other exception type among their kinds."""
    kinds = tuple(dict.fromkeys(p.kind for p in problems if not issubclass(ValueError, p.kind)))
    return _error_class(kinds)(owner, problems)


# Forms that work beyond a field's annotation (a path object for a path, a multiprocessing context object,
# `fsdp=True`), and fields another rule checks with the reference's own message (V1, accelerator_config).
_ACCEPTED_TYPES: dict[str, Any] = {
    "output_dir": str | os.PathLike | None,
    "resume_from_checkpoint": str | os.PathLike | bool | None,
    "deepspeed": dict | str | os.PathLike | None,
    "fsdp_config": dict | str | os.PathLike | None,
    "fsdp": str | bool | list | None,
    "debug": str | list | None,
    "dataloader_multiprocessing_context": Any,
    "accelerator_config": Any,
    "torch_empty_cache_steps": Any,
    "parallelism_config": Any,
    "generation_config": Any,
}


@cache
def _field_types(cls: type) -> dict[str, Any]:
    """The type each catalogue field of ``cls`` accepts: its annotation, widened by ``_ACCEPTED_TYPES``.

    Only the fields our argument classes declare are checked; a subclass's own fields (a library's config
    class built on ours) keep whatever its annotations allow.
    """
    hints: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__.startswith("hf_lightning.args.") and "__dataclass_fields__" in vars(klass):
            hints.update(typing.get_type_hints(klass))
    return {f.name: _ACCEPTED_TYPES.get(f.name, hints[f.name]) for f in fields(cls) if f.init and f.name in hints}


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or type(value).__name__ == "bool_"  # numpy's bool


def _matches(value: Any, tp: Any) -> bool:
    """Whether ``value`` is of type ``tp`` (unions, ``Literal``, ``list[...]``, enums, numbers as numbers)."""
    if tp is Any:
        return True
    if tp is None or tp is type(None):
        return value is None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(tp))
    if origin is typing.Literal:
        return any(type(value) is type(arg) and value == arg for arg in typing.get_args(tp))
    if origin is list or tp is list:
        inner = typing.get_args(tp)
        return isinstance(value, (list, tuple)) and (not inner or all(_matches(v, inner[0]) for v in value))
    if origin is dict or tp is dict:
        return isinstance(value, Mapping)
    if tp is bool:
        return _is_bool(value)
    if tp is int:
        return not _is_bool(value) and (isinstance(value, numbers.Integral) or hasattr(value, "__index__"))
    if tp is float:
        return not _is_bool(value) and not isinstance(value, str) and (
            isinstance(value, numbers.Real) or hasattr(value, "__float__")
        )
    if isinstance(tp, type) and issubclass(tp, Enum):
        return isinstance(value, tp) or value in {member.value for member in tp}
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def _describe(tp: Any) -> str:
    """``tp`` in words: ``a float``, ``a str or None``, ``a list of str``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        words = list(dict.fromkeys(_describe(arg) for arg in typing.get_args(tp)))
        return " or ".join(words)
    if origin is typing.Literal:
        return " or ".join(repr(arg) for arg in typing.get_args(tp))
    if origin is list or tp is list:
        inner = typing.get_args(tp)
        return f"a list of {_describe(inner[0]).removeprefix('a ').removeprefix('an ')}" if inner else "a list"
    if origin is dict or tp is dict:
        return "a dict"
    if tp is None or tp is type(None):
        return "None"
    if isinstance(tp, type) and issubclass(tp, Enum):
        return f"one of {[member.value for member in tp]}"
    name = getattr(tp, "__name__", str(tp))
    return f"an {name}" if name[0] in "aeiouAEIOU" else f"a {name}"


def _shown(name: str, value: Any) -> str:
    """``name=value`` for a message; a ``*_token`` value is never shown."""
    return f"{name}=<{type(value).__name__}, hidden>" if name.endswith("_token") else f"{name}={value!r}"


def _type_problem(name: str, value: Any, tp: Any) -> Problem:
    message = f"{_shown(name, value)} is {_describe(type(value))}, expected {_describe(tp)}."
    if isinstance(value, str) and (_matches(0.5, tp) or _matches(1, tp)):
        try:
            number = float(value)
        except ValueError:
            number = None
        if number is not None:
            written = int(number) if _matches(1, tp) and number.is_integer() else number
            message += (
                f" Write it as a number: {name}={written!r} (in YAML, 5e-5 without a dot is read as a string;"
                " write 5.0e-5)."
            )
    elif isinstance(value, str) and _matches(["x"], tp):
        message += f" Put it in a list: {name}=[{value!r}]."
    elif _matches(1, tp) and isinstance(value, float) and value.is_integer():
        message += f" Pass {name}={int(value)}."
    return Problem(name, message, TypeError)


def check_field_types(args: Any) -> tuple[list[Problem], dict[str, Any]]:
    """The type of every field against its annotation; returns the problems and the well-typed values."""
    problems: list[Problem] = []
    values: dict[str, Any] = {}
    for name, tp in _field_types(type(args)).items():
        value = getattr(args, name)
        if _matches(value, tp):
            values[name] = value
        else:
            problems.append(_type_problem(name, value, tp))
    return problems, values


_NUMPY_SEED_MAX = 2**32 - 1

# (field, accepted, what is accepted and the fix); None values are skipped (None means "unset").
_RANGES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("per_device_train_batch_size", lambda v: v >= 1, "must be >= 1 (samples per device in each forward)."),
    ("per_device_eval_batch_size", lambda v: v >= 1, "must be >= 1 (samples per device in each forward)."),
    (
        "gradient_accumulation_steps",
        lambda v: v >= 1,
        "must be >= 1 (batches per optimizer update; 1 updates after every batch).",
    ),
    ("learning_rate", lambda v: v >= 0, "must be >= 0."),
    ("weight_decay", lambda v: v >= 0, "must be >= 0 (0 disables weight decay)."),
    ("adam_beta1", lambda v: 0 <= v < 1, "must be in [0, 1) (the optimizer's first-moment decay, e.g. 0.9)."),
    ("adam_beta2", lambda v: 0 <= v < 1, "must be in [0, 1) (the optimizer's second-moment decay, e.g. 0.999)."),
    ("adam_epsilon", lambda v: v >= 0, "must be >= 0 (e.g. 1e-8)."),
    ("label_smoothing_factor", lambda v: 0 <= v <= 1, "must be in [0, 1] (0 disables label smoothing)."),
    ("seed", lambda v: 0 <= v <= _NUMPY_SEED_MAX, f"must be in [0, {_NUMPY_SEED_MAX}] (numpy's seed range)."),
    ("data_seed", lambda v: 0 <= v <= _NUMPY_SEED_MAX, f"must be in [0, {_NUMPY_SEED_MAX}] or None."),
    (
        "max_steps",
        lambda v: v != 0,
        "is not a number of steps: pass a positive number of optimizer updates, or -1 (the default) to train "
        "for `num_train_epochs`.",
    ),
    ("dataloader_num_workers", lambda v: v >= 0, "must be >= 0 (0 loads the data in the main process)."),
    ("dataloader_prefetch_factor", lambda v: v >= 1, "must be >= 1 (batches loaded ahead by each worker) or None."),
    ("eval_accumulation_steps", lambda v: v >= 1, "must be >= 1 or None (None keeps every prediction)."),
    ("neftune_noise_alpha", lambda v: v >= 0, "must be >= 0 (e.g. 5.0) or None (no noise)."),
    ("ddp_timeout", lambda v: v > 0, "must be > 0 (seconds, e.g. 1800)."),
    ("ddp_bucket_cap_mb", lambda v: v > 0, "must be > 0 (MB, e.g. 25) or None."),
    ("generation_max_length", lambda v: v >= 1, "must be >= 1 or None (the model's generation config)."),
    ("generation_num_beams", lambda v: v >= 1, "must be >= 1 or None (the model's generation config)."),
    ("output_dir", lambda v: os.fspath(v) != "", "is empty: pass a folder, e.g. 'trainer_output'."),
)


def check_ranges(values: Mapping[str, Any]) -> list[Problem]:
    """Numbers outside the range the optimizer, sampler, seeding or data loader accepts."""
    problems = []
    for name, accepted, rule in _RANGES:
        value = values.get(name)
        if value is None or name not in values:
            continue
        try:
            ok = bool(accepted(value))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            problems.append(Problem(name, f"{_shown(name, value)} {rule}"))
    return problems


_INCLUDE_FOR_METRICS = ("inputs", "loss")
_TOKENS_SEEN = ("all", "non_padding", "no")


# Values the reference takes beyond its catalogue's choices ("ccl": the v4 `xpu_backend` alias's value).
_EXTRA_CHOICES = {"ddp_backend": ["ccl"]}
# The reference looks log levels up in a dict: an unknown one is a KeyError there.
_CHOICE_KINDS: dict[str, type[Exception]] = {"log_level": KeyError, "log_level_replica": KeyError}


def _field_choices(cls: type) -> dict[str, list[Any]]:
    """The closed sets of values the field catalogue declares (``metadata["choices"]``)."""
    return {
        f.name: [*f.metadata["choices"], *_EXTRA_CHOICES.get(f.name, [])]
        for f in fields(cls)
        if "choices" in f.metadata
    }


def _compile_modes() -> list[str]:
    import torch._inductor

    return list(torch._inductor.list_mode_options())


# Backends torch always registers: naming one never needs torch._dynamo imported (seconds) to check it.
_COMMON_COMPILE_BACKENDS = ("inductor", "eager", "aot_eager", "cudagraphs")


def _compile_backends() -> list[str]:
    import torch._dynamo

    return list(torch._dynamo.list_backends(exclude_tags=()))


def _choice_problem(name: str, value: Any, choices: list[Any]) -> Problem:
    kind = _CHOICE_KINDS.get(name, ValueError)
    return Problem(name, f"{_shown(name, value)} is not one of {choices}. Pick one of them.", kind)


def check_choices(args: Any, values: Mapping[str, Any]) -> list[Problem]:
    """Values outside a closed set: log levels, samplers, backends, compile modes, metric inputs."""
    problems = []
    for name, choices in _field_choices(type(args)).items():
        value = values.get(name)
        if isinstance(value, str) and value not in choices:
            problems.append(_choice_problem(name, value, choices))
    tokens = values.get("include_num_input_tokens_seen")
    if isinstance(tokens, str) and tokens not in _TOKENS_SEEN:
        problems.append(_choice_problem("include_num_input_tokens_seen", tokens, [*_TOKENS_SEEN, True, False]))
    unknown = [v for v in values.get("include_for_metrics") or () if v not in _INCLUDE_FOR_METRICS]
    if unknown:
        problems.append(
            Problem(
                "include_for_metrics",
                f"{unknown} not among {list(_INCLUDE_FOR_METRICS)}: list only those (or leave it empty).",
            )
        )
    mode = values.get("torch_compile_mode")
    if mode is not None and mode not in _compile_modes():
        problems.append(_choice_problem("torch_compile_mode", mode, _compile_modes()))
    backend = values.get("torch_compile_backend")
    if backend is not None and backend not in _COMMON_COMPILE_BACKENDS and backend not in _compile_backends():
        problems.append(
            Problem(
                "torch_compile_backend",
                f"{_shown('torch_compile_backend', backend)} is not a backend torch.compile knows here; "
                f"registered: {_compile_backends()}. Pick one (the default is 'inductor').",
            )
        )
    return problems


def _is_steps(strategy: Any) -> bool:
    return getattr(strategy, "value", strategy) == "steps"


def check_loader_combinations(values: Mapping[str, Any]) -> list[Problem]:
    """Worker options without worker processes (checked by the trainer: the reference builds such arguments)."""
    if values.get("dataloader_num_workers") != 0:
        return []
    problems = []
    if values.get("dataloader_persistent_workers"):
        problems.append(
            Problem(
                "dataloader_persistent_workers",
                "True needs worker processes: set `dataloader_num_workers` > 0 or leave it False.",
            )
        )
    context = values.get("dataloader_multiprocessing_context")
    if context is not None:
        problems.append(
            Problem(
                "dataloader_multiprocessing_context",
                f"{context!r} needs worker processes: set `dataloader_num_workers` > 0 or leave it None.",
            )
        )
    return problems


def check_combinations(values: Mapping[str, Any]) -> list[Problem]:
    """Fields valid alone but not together: epochs that would be used, negative intervals of a steps strategy."""
    problems = []
    epochs, max_steps = values.get("num_train_epochs"), values.get("max_steps")
    if epochs is not None and max_steps is not None and max_steps < 0 and not epochs >= 0:
        problems.append(
            Problem(
                "num_train_epochs",
                f"{epochs!r} must be >= 0 when `max_steps` is not set (0 trains no step); or set `max_steps` > 0.",
            )
        )
    for name, strategy in (
        ("logging_steps", "logging_strategy"),
        ("eval_steps", "eval_strategy"),
        ("save_steps", "save_strategy"),
    ):
        value = values.get(name)
        if value is not None and _is_steps(values.get(strategy)) and not value >= 0:
            problems.append(
                Problem(
                    name,
                    f"{value!r} must be > 0 with `{strategy}='steps'`: a number of steps, or a ratio in (0, 1) "
                    "of the total steps.",
                )
            )
    return problems


def check_json_texts(values: Mapping[str, Any]) -> list[Problem]:
    """`lr_scheduler_kwargs` given as text must be a JSON object (the command line's form of the dict): other text
    reaches the schedule function as `**"text"` in the reference's `train()`, a `TypeError` naming no field."""
    text = values.get("lr_scheduler_kwargs")
    if not isinstance(text, str):
        return []
    example = '\'{"num_cycles": 2}\''
    if not text.startswith("{"):
        return [
            Problem(
                "lr_scheduler_kwargs",
                f"{text!r} is text but not a JSON object: give a dict, or the JSON text of one such as {example}.",
                TypeError,
            )
        ]
    try:
        json.loads(text)
    except ValueError as error:
        return [Problem("lr_scheduler_kwargs", f"{text!r} is not valid JSON ({error}); give a dict, or {example}.")]
    return []


def value_problems(args: Any, *, with_loader_options: bool = False) -> list[Problem]:
    """The problems of every family (types first; the others read only the well-typed values).

    ``with_loader_options`` adds the worker-option combinations, which the trainer checks.
    """
    problems, values = check_field_types(args)
    problems += check_ranges(values) + check_choices(args, values) + check_combinations(values)
    problems += check_json_texts(values)
    return problems + (check_loader_combinations(values) if with_loader_options else [])


def check_values(args: Any) -> None:
    """Types, ranges, choices and combinations of every field; one ``InvalidArgumentsError`` lists them all."""
    problems = value_problems(args)
    if problems:
        raise invalid_arguments(type(args).__name__, problems)
