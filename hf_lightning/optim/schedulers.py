"""Every `lr_scheduler_type` of the reference, as pure lambdas wrapped in torch schedulers (R5.4).

Each schedule is a `LambdaLR` over a `functools.partial` of a module-level function, exactly as in
`transformers.optimization`, so `get_last_lr()` and `state_dict()` (and therefore `scheduler.pt`)
match the reference's. Adapted from Hugging Face transformers (Apache-2.0).
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable, Collection
from functools import partial
from itertools import chain
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, ReduceLROnPlateau

from hf_lightning.core.enums import enum_value
from hf_lightning.optim.extras import LayerWiseDummyOptimizer
from hf_lightning.optim.greedy_lr import GreedyLR

# ---------------------------------------------------------------------------------------------
# Pure lambdas: step count -> LR multiplier
# ---------------------------------------------------------------------------------------------


def _get_constant_lambda(_: Any = None) -> float:
    return 1


def _get_constant_schedule_with_warmup_lr_lambda(current_step: int, *, num_warmup_steps: int) -> float:
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1.0, num_warmup_steps))
    return 1.0


def _get_linear_schedule_with_warmup_lr_lambda(
    current_step: int, *, num_warmup_steps: int, num_training_steps: int
) -> float:
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1, num_warmup_steps))
    return max(
        0.0, float(num_training_steps - current_step) / float(max(1, num_training_steps - num_warmup_steps))
    )


def _get_cosine_schedule_with_warmup_lr_lambda(
    current_step: int,
    *,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float,
    min_lr_rate: float = 0.0,
) -> float:
    # Shared by `cosine` and `cosine_with_min_lr` (the reference's second definition of this name wins).
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1, num_warmup_steps))
    progress = float(current_step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    factor = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
    factor = factor * (1 - min_lr_rate) + min_lr_rate
    return max(0, factor)


def _get_cosine_with_hard_restarts_schedule_with_warmup_lr_lambda(
    current_step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: int
) -> float:
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1, num_warmup_steps))
    progress = float(current_step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    if progress >= 1.0:
        return 0.0
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((float(num_cycles) * progress) % 1.0))))


def _get_polynomial_decay_schedule_with_warmup_lr_lambda(
    current_step: int,
    *,
    num_warmup_steps: int,
    num_training_steps: int,
    lr_end: float,
    power: float,
    lr_init: float,
) -> float:
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1, num_warmup_steps))
    if current_step > num_training_steps:
        return lr_end / lr_init  # LambdaLR multiplies by lr_init
    lr_range = lr_init - lr_end
    decay_steps = num_training_steps - num_warmup_steps
    pct_remaining = 1 - (current_step - num_warmup_steps) / decay_steps
    decay = lr_range * pct_remaining**power + lr_end
    return decay / lr_init


def _get_inverse_sqrt_schedule_lr_lambda(
    current_step: int, *, num_warmup_steps: int, timescale: int
) -> float:
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1, num_warmup_steps))
    shift = timescale - num_warmup_steps
    return 1.0 / math.sqrt((current_step + shift) / timescale)


def _get_cosine_with_min_lr_schedule_with_warmup_lr_rate_lambda(
    current_step: int,
    *,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float,
    min_lr_rate: float = 0.0,
    warmup_lr_rate: float | None = None,
) -> float:
    current_step = float(current_step)
    num_warmup_steps = float(num_warmup_steps)
    num_training_steps = float(num_training_steps)
    if current_step < num_warmup_steps:
        if warmup_lr_rate is None:
            return (current_step + 1.0) / max(1.0, num_warmup_steps)
        warmup_lr_rate = float(warmup_lr_rate)
        return warmup_lr_rate + (1.0 - warmup_lr_rate) * current_step / (max(1, num_warmup_steps - 1))
    progress = (current_step - num_warmup_steps + 1.0) / (max(1.0, num_training_steps - num_warmup_steps))
    factor = 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress))
    factor = factor * (1 - min_lr_rate) + min_lr_rate
    return max(0, factor)


def _get_wsd_scheduler_lambda(
    current_step: int,
    *,
    num_warmup_steps: int,
    num_stable_steps: int,
    num_decay_steps: int,
    warmup_type: str,
    decay_type: str,
    min_lr_ratio: float,
    num_cycles: float,
) -> float:
    if current_step < num_warmup_steps:
        progress = float(current_step) / float(max(1, num_warmup_steps))
        if warmup_type == "linear":
            factor = progress
        elif warmup_type == "cosine":
            factor = 0.5 * (1.0 - math.cos(math.pi * progress))
        else:  # "1-sqrt" (validated by get_wsd_schedule)
            factor = 1.0 - math.sqrt(1.0 - progress)
        return max(0.0, factor * (1.0 - min_lr_ratio) + min_lr_ratio)
    if current_step < num_warmup_steps + num_stable_steps:
        return 1.0
    if current_step < num_warmup_steps + num_stable_steps + num_decay_steps:
        progress = float(current_step - num_warmup_steps - num_stable_steps) / float(max(1, num_decay_steps))
        if decay_type == "linear":
            factor = 1.0 - progress
        elif decay_type == "cosine":
            factor = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
        else:  # "1-sqrt"
            factor = 1.0 - math.sqrt(progress)
        return max(0.0, factor * (1.0 - min_lr_ratio) + min_lr_ratio)
    return min_lr_ratio


# ---------------------------------------------------------------------------------------------
# Factories (same names, signatures and checks as transformers.optimization)
# ---------------------------------------------------------------------------------------------


def get_constant_schedule(optimizer: Optimizer, last_epoch: int = -1) -> LambdaLR:
    """Constant LR (`constant`)."""
    return LambdaLR(optimizer, _get_constant_lambda, last_epoch=last_epoch)


def get_reduce_on_plateau_schedule(optimizer: Optimizer, **kwargs: Any) -> ReduceLROnPlateau:
    """torch `ReduceLROnPlateau` with the given kwargs (`reduce_lr_on_plateau`)."""
    return ReduceLROnPlateau(optimizer, **kwargs)


def get_constant_schedule_with_warmup(
    optimizer: Optimizer, num_warmup_steps: int, last_epoch: int = -1
) -> LambdaLR:
    """Linear warmup from 0, then constant (`constant_with_warmup`)."""
    lr_lambda = partial(_get_constant_schedule_with_warmup_lr_lambda, num_warmup_steps=num_warmup_steps)
    return LambdaLR(optimizer, lr_lambda, last_epoch=last_epoch)


def get_linear_schedule_with_warmup(
    optimizer: Optimizer, num_warmup_steps: int, num_training_steps: int, last_epoch: int = -1
) -> LambdaLR:
    """Linear warmup, then linear decay to 0 at `num_training_steps` (`linear`)."""
    lr_lambda = partial(
        _get_linear_schedule_with_warmup_lr_lambda,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
    )
    return LambdaLR(optimizer, lr_lambda, last_epoch)


def get_cosine_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
) -> LambdaLR:
    """Linear warmup, then cosine decay (`cosine`)."""
    lr_lambda = partial(
        _get_cosine_schedule_with_warmup_lr_lambda,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
    )
    return LambdaLR(optimizer, lr_lambda, last_epoch)


def get_cosine_with_hard_restarts_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: int = 1,
    last_epoch: int = -1,
) -> LambdaLR:
    """Linear warmup, then `num_cycles` cosine decays with hard restarts (`cosine_with_restarts`)."""
    lr_lambda = partial(
        _get_cosine_with_hard_restarts_schedule_with_warmup_lr_lambda,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
    )
    return LambdaLR(optimizer, lr_lambda, last_epoch)


def get_polynomial_decay_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    lr_end: float = 1e-7,
    power: float = 1.0,
    last_epoch: int = -1,
) -> LambdaLR:
    """Linear warmup, then polynomial decay to `lr_end` (`polynomial`)."""
    lr_init = optimizer.defaults["lr"]
    if not (lr_init > lr_end):
        raise ValueError(f"lr_end ({lr_end}) must be smaller than initial lr ({lr_init})")
    lr_lambda = partial(
        _get_polynomial_decay_schedule_with_warmup_lr_lambda,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        lr_end=lr_end,
        power=power,
        lr_init=lr_init,
    )
    return LambdaLR(optimizer, lr_lambda, last_epoch)


def get_inverse_sqrt_schedule(
    optimizer: Optimizer, num_warmup_steps: int, timescale: int | None = None, last_epoch: int = -1
) -> LambdaLR:
    """Linear warmup, then `1/sqrt` decay with `timescale` (default W, or 10000 if W=0) (`inverse_sqrt`)."""
    if timescale is None:
        timescale = num_warmup_steps or 10_000
    lr_lambda = partial(
        _get_inverse_sqrt_schedule_lr_lambda, num_warmup_steps=num_warmup_steps, timescale=timescale
    )
    return LambdaLR(optimizer, lr_lambda, last_epoch=last_epoch)


def _resolve_min_lr_rate(optimizer: Optimizer, min_lr: float | None, min_lr_rate: float | None) -> float:
    if min_lr is not None and min_lr_rate is not None:
        raise ValueError("Only one of min_lr or min_lr_rate should be set")
    if min_lr is not None:
        return min_lr / optimizer.defaults["lr"]
    if min_lr_rate is None:
        raise ValueError("One of min_lr or min_lr_rate should be set through the `lr_scheduler_kwargs`")
    return min_lr_rate


def get_cosine_with_min_lr_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    min_lr: float | None = None,
    min_lr_rate: float | None = None,
) -> LambdaLR:
    """Linear warmup, then cosine decay to `min_lr` (`cosine_with_min_lr`)."""
    lr_lambda = partial(
        _get_cosine_schedule_with_warmup_lr_lambda,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
        min_lr_rate=_resolve_min_lr_rate(optimizer, min_lr, min_lr_rate),
    )
    return LambdaLR(optimizer, lr_lambda, last_epoch)


def get_cosine_with_min_lr_schedule_with_warmup_lr_rate(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    min_lr: float | None = None,
    min_lr_rate: float | None = None,
    warmup_lr_rate: float | None = None,
) -> LambdaLR:
    """Warmup starting above 0, then cosine decay to `min_lr` (`cosine_warmup_with_min_lr`)."""
    lr_lambda = partial(
        _get_cosine_with_min_lr_schedule_with_warmup_lr_rate_lambda,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
        min_lr_rate=_resolve_min_lr_rate(optimizer, min_lr, min_lr_rate),
        warmup_lr_rate=warmup_lr_rate,
    )
    return LambdaLR(optimizer, lr_lambda, last_epoch)


_WSD_SHAPES = ("linear", "cosine", "1-sqrt")


def get_wsd_schedule(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_decay_steps: int,
    num_training_steps: int | None = None,
    num_stable_steps: int | None = None,
    warmup_type: str = "linear",
    decay_type: str = "cosine",
    min_lr_ratio: float = 0,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
) -> LambdaLR:
    """Warmup, stable, decay (`warmup_stable_decay`); `num_decay_steps` is required."""
    if num_training_steps is None and num_stable_steps is None:
        raise ValueError("Either num_training_steps or num_stable_steps must be specified.")
    if num_training_steps is not None and num_stable_steps is not None:
        warnings.warn(
            "Both num_training_steps and num_stable_steps are specified. num_stable_steps will be used.",
            stacklevel=2,
        )
    if warmup_type not in _WSD_SHAPES:
        raise ValueError(f"Unknown warmup type: {warmup_type}, expected 'linear', 'cosine' or '1-sqrt'")
    if decay_type not in _WSD_SHAPES:
        raise ValueError(f"Unknown decay type: {decay_type}, expected 'linear', 'cosine' or '1-sqrt'")
    if num_stable_steps is None:
        num_stable_steps = num_training_steps - num_warmup_steps - num_decay_steps
    lr_lambda = partial(
        _get_wsd_scheduler_lambda,
        num_warmup_steps=num_warmup_steps,
        num_stable_steps=num_stable_steps,
        num_decay_steps=num_decay_steps,
        warmup_type=warmup_type,
        decay_type=decay_type,
        min_lr_ratio=min_lr_ratio,
        num_cycles=num_cycles,
    )
    return LambdaLR(optimizer, lr_lambda, last_epoch)


# ---------------------------------------------------------------------------------------------
# GreedyLR (metric-driven; the class lives in greedy_lr.py)
# ---------------------------------------------------------------------------------------------


def get_greedy_schedule(optimizer: Optimizer, **kwargs: Any) -> GreedyLR:
    """Metric-driven `GreedyLR` (`greedy`)."""
    return GreedyLR(optimizer, **kwargs)


# SchedulerType value -> factory.
TYPE_TO_SCHEDULER_FUNCTION: dict[str, Callable[..., Any]] = {
    "linear": get_linear_schedule_with_warmup,
    "cosine": get_cosine_schedule_with_warmup,
    "cosine_with_restarts": get_cosine_with_hard_restarts_schedule_with_warmup,
    "polynomial": get_polynomial_decay_schedule_with_warmup,
    "constant": get_constant_schedule,
    "constant_with_warmup": get_constant_schedule_with_warmup,
    "inverse_sqrt": get_inverse_sqrt_schedule,
    "reduce_lr_on_plateau": get_reduce_on_plateau_schedule,
    "cosine_with_min_lr": get_cosine_with_min_lr_schedule_with_warmup,
    "cosine_warmup_with_min_lr": get_cosine_with_min_lr_schedule_with_warmup_lr_rate,
    "warmup_stable_decay": get_wsd_schedule,
    "greedy": get_greedy_schedule,
}

# Schedulers stepped with an evaluation metric instead of after every optimizer step (R5.6).
METRIC_DRIVEN_SCHEDULERS = ("reduce_lr_on_plateau", "greedy")


class LayerWiseDummyScheduler(LRScheduler):
    """Stand-in scheduler for layer-wise optimizers (GaLore/APOLLO `_layerwise`): the per-parameter
    schedulers step from gradient hooks; this one only reports their LRs (`get_last_lr()`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.default_lr = kwargs["lr"]
        optimizer = LayerWiseDummyOptimizer(**kwargs)
        super().__init__(optimizer, -1)

    def get_lr(self) -> list[float]:
        """Every per-parameter optimizer's LRs, in parameter order (the default LR if there are none)."""
        if self.optimizer is None or not self.optimizer.optimizer_dict:
            return [self.default_lr]
        return list(
            chain(*[[g["lr"] for g in opt.param_groups] for opt in self.optimizer.optimizer_dict.values()])
        )

    def step(self, epoch: int | None = None) -> None:
        # Only refresh the report. The reference lets LRScheduler.step write these LRs into the dummy
        # optimizer's single group, which the strict zip of recent torch (2.13) rejects, so its
        # layer-wise optimizers fail there; the LRs reported are the same.
        self._step_count = getattr(self, "_step_count", 0) + 1
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        self._last_lr = self.get_lr()

    def _get_closed_form_lr(self) -> list[float]:
        return self.base_lrs


def _scheduler_name(name: Any) -> str:
    value = enum_value(name)
    if value not in TYPE_TO_SCHEDULER_FUNCTION:
        raise ValueError(
            f"lr_scheduler_type={value!r} is not a valid SchedulerType, please select one of "
            f"{list(TYPE_TO_SCHEDULER_FUNCTION)}"
        )
    return value


def get_scheduler(
    name: Any,
    optimizer: Optimizer,
    num_warmup_steps: int | None = None,
    num_training_steps: int | None = None,
    scheduler_specific_kwargs: dict[str, Any] | None = None,
) -> Any:
    """Build the scheduler `name` (a str or str-valued enum) like `transformers.get_scheduler`.

    Unknown `scheduler_specific_kwargs` keys raise TypeError from the factory, as in the reference.
    """
    name = _scheduler_name(name)
    schedule_func = TYPE_TO_SCHEDULER_FUNCTION[name]

    if optimizer is not None and isinstance(optimizer, LayerWiseDummyOptimizer):
        # One scheduler per parameter's optimizer, stepped from the same gradient hooks.
        optimizer_dict = optimizer.optimizer_dict
        scheduler_dict = {
            param: get_scheduler(
                name,
                optimizer=optimizer_dict[param],
                num_warmup_steps=num_warmup_steps,
                num_training_steps=num_training_steps,
                scheduler_specific_kwargs=scheduler_specific_kwargs,
            )
            for param in optimizer_dict
        }

        def scheduler_hook(param: Any) -> None:
            scheduler_dict[param].step()

        for param in optimizer_dict:
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(scheduler_hook)
        return LayerWiseDummyScheduler(optimizer_dict=optimizer_dict, lr=optimizer.defaults["lr"])

    if name == "constant":
        return schedule_func(optimizer)

    if scheduler_specific_kwargs is None:
        scheduler_specific_kwargs = {}

    if name in METRIC_DRIVEN_SCHEDULERS:
        return schedule_func(optimizer, **scheduler_specific_kwargs)

    if num_warmup_steps is None:
        raise ValueError(f"{name} requires `num_warmup_steps`, please provide that argument.")

    if name == "constant_with_warmup":
        return schedule_func(optimizer, num_warmup_steps=num_warmup_steps)

    if name == "inverse_sqrt":
        return schedule_func(optimizer, num_warmup_steps=num_warmup_steps, **scheduler_specific_kwargs)

    if name == "warmup_stable_decay":
        # Needs num_training_steps or num_stable_steps; get_wsd_schedule checks.
        return schedule_func(
            optimizer,
            num_warmup_steps=num_warmup_steps,
            num_training_steps=num_training_steps,
            **scheduler_specific_kwargs,
        )

    if num_training_steps is None:
        raise ValueError(f"{name} requires `num_training_steps`, please provide that argument.")

    return schedule_func(
        optimizer,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        **scheduler_specific_kwargs,
    )


# Factories that pass their keyword arguments on to a class.
_KWARGS_TAKEN_BY: dict[str, type] = {"reduce_lr_on_plateau": ReduceLROnPlateau, "greedy": GreedyLR}
# Given by the trainer itself, never through `lr_scheduler_kwargs`.
_TRAINER_GIVEN = ("optimizer", "num_warmup_steps", "num_training_steps")


def scheduler_kwarg_names(name: Any) -> list[str] | None:
    """The `lr_scheduler_kwargs` keys schedule `name` takes; None when it takes none and ignores them."""
    value = _scheduler_name(name)
    if value in ("constant", "constant_with_warmup"):
        return None  # get_scheduler passes them no keyword arguments, as the reference's does
    target: Callable[..., Any] = _KWARGS_TAKEN_BY.get(value, TYPE_TO_SCHEDULER_FUNCTION[value])
    parameters = inspect.signature(target).parameters.values()
    return [
        p.name
        for p in parameters
        if p.name not in _TRAINER_GIVEN and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]


# Schedules that need one of several keys of `lr_scheduler_kwargs` (`_resolve_min_lr_rate` raises without one).
_ONE_OF_REQUIRED = {
    "cosine_with_min_lr": ("min_lr", "min_lr_rate"),
    "cosine_warmup_with_min_lr": ("min_lr", "min_lr_rate"),
}


def missing_scheduler_kwargs(name: Any, given: Collection[str]) -> list[str]:
    """The keys schedule `name` needs in `lr_scheduler_kwargs` that `given` lacks, each as the error names it
    (`num_decay_steps`; `min_lr or min_lr_rate`). Empty for a schedule that needs none."""
    value = _scheduler_name(name)
    if value in ("constant", "constant_with_warmup") or value in _KWARGS_TAKEN_BY:
        return []
    parameters = inspect.signature(TYPE_TO_SCHEDULER_FUNCTION[value]).parameters.values()
    missing = [
        p.name
        for p in parameters
        if p.name not in _TRAINER_GIVEN and p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in given
    ]
    alternatives = _ONE_OF_REQUIRED.get(value, ())
    if alternatives and not any(key in given for key in alternatives):
        missing.append(" or ".join(alternatives))
    return missing

