"""The reference's argument rules V1..V16, as its `TrainingArguments.__post_init__` and `_validate_args` check them.

Each rule is a small function raising `ValueError` with a message naming the field(s) and the fix.
`validate_arguments` runs the rules the reference checks in `_validate_args`, in its order; the others (V12, V13,
V14, V15, V16) are called from `__post_init__` at the reference's step. Our own checks of every value (types,
ranges, choices, combinations) are `args/validation.py`.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from enum import Enum
from typing import Any, TypeVar

from hf_lightning.core.enums import IntervalStrategy, SaveStrategy, SchedulerType

__all__ = [
    "accelerator_assumed",
    "assumed_accelerator",
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
