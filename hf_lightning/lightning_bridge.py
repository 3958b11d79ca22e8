"""Build the `lightning.Trainer` for one `train()` call from the translation plan.

The plan is computed once at construction (pure); the run-dependent limits (`max_steps`, the epoch
bound) are only known once the train dataloader exists, so they are added here.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import lightning.pytorch as pl

from hf_lightning import schedule
from hf_lightning.precision import lightning_precision_kwargs

# Lightning's start-up banners ("GPU available", tips, "fit stopped") are noise next to the
# reference's own output; real warnings still come through.
_QUIET_LOGGERS = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.pytorch.accelerators.cuda",
    "lightning.fabric.utilities.seed",
)


def quiet_lightning_banners() -> None:
    """Raise Lightning's banner loggers to WARNING (idempotent)."""
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def lightning_trainer_kwargs(plan: Any, values: schedule.TrainingValues) -> dict[str, Any]:
    """The plan's `lightning.Trainer` kwargs with this run's step and epoch bounds."""
    kwargs = dict(plan.trainer_kwargs)
    kwargs.update(lightning_precision_kwargs(kwargs.pop("precision", "32-true")))
    kwargs["max_steps"] = values.max_steps
    kwargs["max_epochs"] = -1 if values.num_train_epochs >= sys.maxsize else values.num_train_epochs
    return kwargs


def build_lightning_trainer(
    plan: Any, values: schedule.TrainingValues, user_callbacks: list[pl.Callback] = (), model: Any = None
) -> pl.Trainer:
    """A `lightning.Trainer` configured by the plan, with the plan's loggers, its callbacks and the user's."""
    from hf_lightning.loggers import build_loggers

    quiet_lightning_banners()
    kwargs = lightning_trainer_kwargs(plan, values)
    loggers = build_loggers(plan)
    if loggers:
        kwargs["logger"] = loggers
    if plan.strategy is not None:
        from hf_lightning.translate import build_strategy

        kwargs["strategy"] = build_strategy(plan, model)
    kwargs["callbacks"] = list(plan.callbacks) + list(kwargs.get("callbacks") or []) + list(user_callbacks)
    return pl.Trainer(**kwargs)
