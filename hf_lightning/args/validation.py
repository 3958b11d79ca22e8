"""Argument-construction validation: the reference's rules V1..V16, then our value checks.

Each reference rule is a small function raising ``ValueError`` with a message naming the field(s) and the fix.
``validate_arguments`` runs the rules the reference checks in ``_validate_args``, in its order; the
others (V12, V13, V14, V15, V16) are called from ``__post_init__`` at the reference's step.

``check_values`` runs first, on the values as given: the type of every field against its annotation, the
ranges, the closed sets of choices and the combinations the reference leaves to torch, numpy or its loop to
fail on deep inside ``train()`` (one function per family). Every problem of one object is gathered into one
``InvalidArgumentsError`` (a ``ValueError``, and also the type the reference raises for it: ``TypeError`` for a
wrong type, ``KeyError`` for an unknown log level), as the translation's refusal gathers the refused fields.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import numbers
import os
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from enum import Enum
from functools import cache
from typing import Any, TypeVar

from hf_lightning.core.enums import IntervalStrategy, SaveStrategy, SchedulerType

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
    "check_bf16_supported",
    "check_empty_cache_steps",
    "check_eval_steps_available",
    "check_full_eval_precision",
    "check_load_best_model_strategies",
    "check_logging_steps_nonzero",
    "check_mixed_precision",
    "check_prefetch_factor",
    "check_scheduler_needs_eval",
    "check_tf32_supported",
    "check_warmup_steps",
    "integral_step_values",
    "to_enum",
    "validate_arguments",
    "value_problems",
]

E = TypeVar("E", bound=Enum)


def to_enum(enum_cls: type[E], value: Any, field_name: str) -> E:
    """V13: convert ``value`` into ``enum_cls``; an unknown value names the field and lists the valid ones."""
    try:
        return enum_cls(value)
    except ValueError:
        valid = [member.value for member in enum_cls]
        raise ValueError(
            f"{field_name}: {value!r} is not a valid {enum_cls.__name__}; please select one of {valid}."
        ) from None


def check_empty_cache_steps(args: Any) -> None:
    """V1: ``torch_empty_cache_steps`` must be an int > 0 (``1.0`` is refused, as in the reference)."""
    value = args.torch_empty_cache_steps
    if value is not None and not (isinstance(value, int) and value > 0):
        raise ValueError(
            f"`torch_empty_cache_steps` must be an integer bigger than 0, got {value}. Pass a positive int or None."
        )


def check_logging_steps_nonzero(args: Any) -> None:
    """V2: ``logging_strategy="steps"`` needs a non-zero ``logging_steps``."""
    if args.logging_strategy == IntervalStrategy.STEPS and args.logging_steps == 0:
        raise ValueError(
            f"logging strategy {args.logging_strategy.value!r} requires non-zero `logging_steps`; set "
            "`logging_steps` > 0 or choose another `logging_strategy`."
        )


def integral_step_values(args: Any) -> None:
    """V3 / R1.3: step values above 1 must be integral and become ``int``; ratios below 1 are kept."""
    pairs = (
        ("logging_steps", args.logging_strategy == IntervalStrategy.STEPS),
        ("eval_steps", args.eval_strategy == IntervalStrategy.STEPS),
        ("save_steps", args.save_strategy == SaveStrategy.STEPS),
    )
    for name, active in pairs:
        value = getattr(args, name)
        if active and value > 1:
            if value != int(value):
                raise ValueError(
                    f"`{name}` must be an integer if bigger than 1: {value}. Use a whole number of steps, "
                    "or a ratio in [0, 1) of the total steps."
                )
            setattr(args, name, int(value))


def check_load_best_model_strategies(args: Any) -> None:
    """V4 / V5: ``load_best_model_at_end`` needs matching strategies and save steps multiple of eval steps."""
    if not args.load_best_model_at_end or args.save_strategy == SaveStrategy.BEST:
        return
    if args.eval_strategy != args.save_strategy:
        raise ValueError(
            "`load_best_model_at_end` requires the save and eval strategy to match, except when "
            f'`save_strategy="best"`, but found `eval_strategy`={args.eval_strategy.value!r} and '
            f"`save_strategy`={args.save_strategy.value!r}. Set both to the same value."
        )
    save, evals = args.save_steps, args.eval_steps
    if args.eval_strategy != IntervalStrategy.STEPS or save % evals == 0:
        return
    if evals < 1 or save < 1:
        if not (evals < 1 and save < 1):
            raise ValueError(
                "`load_best_model_at_end` requires the saving steps to be a multiple of the evaluation steps, "
                f"which cannot get guaranteed when mixing ratio and absolute steps for `save_steps` {save} and "
                f"`eval_steps` {evals}. Give both as ratios or both as step counts."
            )
        # Integer arithmetic on scaled values avoids float rounding (0.3 % 0.1 != 0 in floats).
        large_multiplier = 1_000_000
        if (save * large_multiplier) % (evals * large_multiplier) != 0:
            raise ValueError(
                "`load_best_model_at_end` requires the saving steps to be a multiple of the evaluation steps, "
                f"but `save_steps` {save} is not a multiple of `eval_steps` {evals}."
            )
    else:
        raise ValueError(
            "`load_best_model_at_end` requires the saving steps to be a round multiple of the evaluation steps, "
            f"but `save_steps` {save} is not a round multiple of `eval_steps` {evals}."
        )


# The accelerator kind the machine checks assume instead of this machine's ("gpu", "mps", "cpu"), or None:
# `hf-lightning explain --accelerator gpu` previews a GPU run's arguments on a laptop.
_ASSUMED_ACCELERATOR: dict[str, str | None] = {"kind": None}


@contextlib.contextmanager
def assumed_accelerator(kind: str | None) -> Iterator[None]:
    """Check arguments built inside as for a machine with this accelerator (a CUDA GPU of compute capability 8
    or more for "gpu"), not for this one; None checks this machine."""
    previous = _ASSUMED_ACCELERATOR["kind"]
    _ASSUMED_ACCELERATOR["kind"] = kind
    try:
        yield
    finally:
        _ASSUMED_ACCELERATOR["kind"] = previous


def accelerator_assumed() -> bool:
    """Whether arguments are being checked for another machine (`assumed_accelerator`): nothing of this one's
    set-up (TF32) may change then."""
    return _ASSUMED_ACCELERATOR["kind"] is not None


def _bf16_accelerator_available() -> bool:
    """Whether an accelerator with bf16 support (or XLA) is present; CUDA is only queried when available."""
    import torch

    if _ASSUMED_ACCELERATOR["kind"] is not None:
        return _ASSUMED_ACCELERATOR["kind"] in ("gpu", "mps")

    if importlib.util.find_spec("torch_xla") is not None:
        return True
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return xpu.is_bf16_supported()
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return mps.is_macos_or_newer(14, 0)
    return False


def check_bf16_supported(args: Any) -> None:
    """V6: ``bf16`` / ``bf16_full_eval`` without ``use_cpu`` need a bf16-capable accelerator."""
    if (args.bf16 or args.bf16_full_eval) and not args.use_cpu and not _bf16_accelerator_available():
        raise ValueError(
            "bf16 / bf16_full_eval: your setup doesn't support bf16 on an accelerator. Set `use_cpu=True` to "
            "train on CPU in bf16, or use an Ampere+ GPU with cuda>=11.0."
        )


def check_mixed_precision(args: Any) -> None:
    """V7: at most one of ``fp16`` and ``bf16``."""
    if args.fp16 and args.bf16:
        raise ValueError("At most one of `fp16` and `bf16` can be True, but not both. Pick one.")


def check_full_eval_precision(args: Any) -> None:
    """V8: at most one of ``fp16_full_eval`` and ``bf16_full_eval``."""
    if args.fp16_full_eval and args.bf16_full_eval:
        raise ValueError(
            "At most one of `fp16_full_eval` and `bf16_full_eval` can be True, but not both. Pick one."
        )


def check_scheduler_needs_eval(args: Any) -> None:
    """V9: metric-driven schedulers need an evaluation strategy."""
    if args.lr_scheduler_type in (SchedulerType.REDUCE_ON_PLATEAU, SchedulerType.GREEDY):
        if args.eval_strategy == IntervalStrategy.NO:
            raise ValueError(
                f"`lr_scheduler_type` {args.lr_scheduler_type.value} requires an eval strategy: set "
                '`eval_strategy` to "steps" or "epoch".'
            )


def check_warmup_steps(args: Any) -> None:
    """V10: ``warmup_steps`` must be >= 0."""
    if args.warmup_steps < 0:
        raise ValueError(f"Got `warmup_steps` = {args.warmup_steps}; expected `warmup_steps` >= 0.")


def check_prefetch_factor(args: Any) -> None:
    """V11: ``dataloader_prefetch_factor`` needs worker processes."""
    if args.dataloader_num_workers == 0 and args.dataloader_prefetch_factor is not None:
        raise ValueError(
            "`dataloader_prefetch_factor` can only be set when data is loaded in a different process, i.e. "
            "when `dataloader_num_workers` > 0. Set `dataloader_num_workers` or leave the prefetch factor None."
        )


def check_eval_steps_available(args: Any) -> None:
    """V12: ``eval_strategy="steps"`` with no ``eval_steps`` takes ``logging_steps``, which must be > 0."""
    if args.eval_strategy == IntervalStrategy.STEPS and (args.eval_steps is None or args.eval_steps == 0):
        if args.logging_steps > 0:
            args.eval_steps = args.logging_steps
        else:
            raise ValueError(
                f"evaluation strategy {args.eval_strategy.value!r} requires either non-zero `eval_steps` or "
                "`logging_steps`."
            )


def _tf32_available() -> bool:
    """TF32 needs a CUDA device of compute capability 8 or more (queried only when CUDA is available)."""
    import torch

    if _ASSUMED_ACCELERATOR["kind"] is not None:
        return _ASSUMED_ACCELERATOR["kind"] == "gpu"
    if not torch.cuda.is_available() or torch.version.cuda is None:
        return False
    return torch.cuda.get_device_properties(torch.cuda.current_device()).major >= 8


def check_tf32_supported(args: Any) -> bool:
    """V14: ``tf32=True`` without TF32 hardware raises; returns whether TF32 is available."""
    available = _tf32_available()
    if args.tf32 and not available:
        raise ValueError(
            "`tf32=True` requires Ampere or a newer GPU arch, cuda>=11 and torch>=1.7. Leave `tf32` None "
            "(or False) on this machine."
        )
    return available


def validate_arguments(args: Any) -> None:
    """The rules the reference checks in ``_validate_args`` (V1-V11), in its order."""
    check_empty_cache_steps(args)
    check_logging_steps_nonzero(args)
    integral_step_values(args)
    check_load_best_model_strategies(args)
    check_bf16_supported(args)
    check_mixed_precision(args)
    check_full_eval_precision(args)
    check_scheduler_needs_eval(args)
    check_warmup_steps(args)
    check_prefetch_factor(args)


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
