"""Every `lr_scheduler_type` of the reference, as pure lambdas wrapped in torch schedulers (spec R5.4).

Each schedule is a `LambdaLR` over a `functools.partial` of a module-level function, exactly as in
`transformers.optimization`, so `get_last_lr()` and `state_dict()` (and therefore `scheduler.pt`)
match the reference's. Adapted from Hugging Face transformers (Apache-2.0).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from functools import partial
from itertools import chain
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, ReduceLROnPlateau

from hf_lightning.optim import LayerWiseDummyOptimizer

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
# GreedyLR (metric-driven, port of transformers.optimization.GreedyLR)
# ---------------------------------------------------------------------------------------------


class StreamingAverage:
    """Rolling-window mean used by `GreedyLR(smooth=True)` to smooth noisy metrics."""

    def __init__(self, window_size: int) -> None:
        self.window_size: int = window_size
        self.values: list[float] = []
        self.sum: float = 0.0

    def streamavg(self, value: float) -> float:
        """Add `value` and return the mean of the last `window_size` values."""
        self.values.append(value)
        self.sum += value
        if len(self.values) > self.window_size:
            self.sum -= self.values.pop(0)
        return self.sum / len(self.values)

    def state_dict(self) -> dict[str, Any]:
        return {"window_size": self.window_size, "values": self.values.copy(), "sum": self.sum}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.window_size = state_dict.get("window_size", self.window_size)
        self.values = state_dict.get("values", []).copy()
        self.sum = state_dict.get("sum", 0.0)


# The attributes GreedyLR saves, in the reference's order (its state_dict keys).
_GREEDY_STATE_KEYS = (
    "factor", "min_lrs", "max_lrs", "patience", "verbose", "cooldown", "warmup", "cooldown_counter",
    "warmup_counter", "mode", "threshold", "threshold_mode", "best", "num_bad_epochs", "num_good_epochs",
    "eps", "last_epoch", "smooth", "window_size", "reset_start", "reset_start_original", "_last_lr", "_init_lrs",
)  # fmt: skip


class GreedyLR:
    """Metric-driven LR: divides the LR by `factor` after more than `patience` improving evaluations and
    multiplies it by `factor` after more than `patience` non-improving ones (arXiv 2512.14527)."""

    def __init__(
        self,
        optimizer: Optimizer,
        mode: str = "min",
        factor: float = 0.95,
        patience: int = 10,
        threshold: float = 1e-6,
        threshold_mode: str = "abs",
        cooldown: int = 0,
        warmup: int = 0,
        min_lr: float | list[float] = 1e-3,
        max_lr: float | list[float] = 1.0,
        eps: float = 1e-8,
        verbose: bool = False,
        smooth: bool = False,
        window_size: int = 50,
        reset_start: int = 500,
    ) -> None:
        if factor >= 1.0:
            raise ValueError("Factor should be < 1.0.")
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        self.factor = factor
        self.patience = patience
        self.verbose = verbose
        self.cooldown = cooldown
        self.warmup = warmup
        self.cooldown_counter = 0
        self.warmup_counter = 0
        self.mode = mode
        self.threshold = threshold
        self.threshold_mode = threshold_mode
        self.eps = eps
        self.smooth = smooth
        self.window_size = window_size
        self.reset_start = reset_start
        self.reset_start_original = reset_start
        self.last_epoch = 0
        self.min_lrs = self._per_group(min_lr, "min_lrs")
        self.max_lrs = self._per_group(max_lr, "max_lrs")
        self._init_lrs = [group["lr"] for group in optimizer.param_groups]
        self._last_lr = self._init_lrs.copy()
        self.best: float = float("inf") if mode == "min" else float("-inf")
        self.num_bad_epochs = 0
        self.num_good_epochs = 0
        if mode not in ("min", "max"):
            raise ValueError(f"mode {mode} is unknown!")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"threshold mode {threshold_mode} is unknown!")
        self._streaming_avg: StreamingAverage | None = StreamingAverage(window_size) if smooth else None

    def _per_group(self, value: float | list[float], what: str) -> list[float]:
        n_groups = len(self.optimizer.param_groups)
        if isinstance(value, (list, tuple)):
            if len(value) != n_groups:
                raise ValueError(f"expected {n_groups} {what}, got {len(value)}")
            return list(value)
        return [value] * n_groups

    def step(self, metrics: float, epoch: int | None = None) -> None:
        """Update the LRs from one evaluation metric."""
        current = float(metrics)
        if self.smooth and self._streaming_avg is not None:
            current = self._streaming_avg.streamavg(current)
        if epoch is None:
            epoch = self.last_epoch + 1
        self.last_epoch = epoch

        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
            self.num_good_epochs = 0
        elif self.warmup_counter > 0:
            self.warmup_counter -= 1
            self.num_bad_epochs = 0
            self.num_good_epochs = 0
        else:
            if self.is_better(current, self.best):
                self.best = current
                self.num_bad_epochs = 0
                self.num_good_epochs += 1
            else:
                self.num_bad_epochs += 1
                self.num_good_epochs = 0
            if self.num_good_epochs > self.patience:
                self._increase_lr(epoch)
                self.warmup_counter = self.warmup
                self.num_good_epochs = 0
            elif self.num_bad_epochs > self.patience:
                self._reduce_lr(epoch)
                self.cooldown_counter = self.cooldown
                self.num_bad_epochs = 0
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def is_better(self, current: float, best: float) -> bool:
        """Whether `current` improves on `best` beyond the threshold."""
        if self.mode == "min":
            if self.threshold_mode == "rel":
                return current < best * (1.0 - self.threshold)
            return current < best - self.threshold
        if self.threshold_mode == "rel":
            return current > best * (1.0 + self.threshold)
        return current > best + self.threshold

    def _reduce_lr(self, epoch: int) -> None:
        all_at_min = True
        for i, param_group in enumerate(self.optimizer.param_groups):
            old_lr = float(param_group["lr"])
            new_lr = max(old_lr * self.factor, self.min_lrs[i])
            if old_lr - new_lr > self.eps:
                param_group["lr"] = new_lr
                if self.verbose:
                    print(f"Epoch {epoch}: reducing learning rate of group {i} to {new_lr:.4e}.")
            if param_group["lr"] > self.min_lrs[i]:
                all_at_min = False
        if all_at_min:
            self.reset_start -= 1
            if self.reset_start <= 0:
                self._reset()

    def _increase_lr(self, epoch: int) -> None:
        for i, param_group in enumerate(self.optimizer.param_groups):
            old_lr = float(param_group["lr"])
            new_lr = min(old_lr / self.factor, self.max_lrs[i])
            if new_lr - old_lr > self.eps:
                param_group["lr"] = new_lr
                if self.verbose:
                    print(f"Epoch {epoch}: increasing learning rate of group {i} to {new_lr:.4e}.")
        self.reset_start = self.reset_start_original

    def _reset(self) -> None:
        for i, param_group in enumerate(self.optimizer.param_groups):
            param_group["lr"] = self._init_lrs[i]
        self.best = float("inf") if self.mode == "min" else float("-inf")
        self.num_bad_epochs = 0
        self.num_good_epochs = 0
        self.cooldown_counter = 0
        self.warmup_counter = 0
        self.reset_start = self.reset_start_original
        if self.smooth and self._streaming_avg is not None:
            self._streaming_avg = StreamingAverage(self.window_size)
        if self.verbose:
            print("Scheduler reset to initial state.")

    def get_last_lr(self) -> list[float]:
        """The LRs after the last step."""
        return self._last_lr

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state, with the reference's keys."""
        state = {key: getattr(self, key) for key in _GREEDY_STATE_KEYS}
        if self.smooth and self._streaming_avg is not None:
            state["_streaming_avg"] = self._streaming_avg.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state from `state_dict` (ours or the reference's); also restores the groups' LRs."""
        for key in _GREEDY_STATE_KEYS:
            setattr(self, key, state_dict.get(key, getattr(self, key)))
        if "_streaming_avg" in state_dict:
            if self._streaming_avg is None:
                self._streaming_avg = StreamingAverage(self.window_size)
            self._streaming_avg.load_state_dict(state_dict["_streaming_avg"])
        if "_last_lr" in state_dict:
            for param_group, lr in zip(self.optimizer.param_groups, self._last_lr):
                param_group["lr"] = lr


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
    value = getattr(name, "value", name)
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
