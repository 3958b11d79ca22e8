"""`EarlyStoppingCallback`: stops training when `metric_for_best_model` stops improving (the reference's rule)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from hf_lightning.callbacks.base import TrainerCallback
from hf_lightning.callbacks.state import ExportableState, TrainerControl, TrainerState
from hf_lightning.core.enums import enum_value

logger = logging.getLogger(__name__)


class EarlyStoppingConfigError(ValueError, AssertionError):
    """Early stopping is configured without what it needs.

    The reference asserts here; this error is also an `AssertionError` so code written against it still works,
    and a `ValueError` because it is a configuration mistake (and asserts vanish under `python -O`).
    """


class EarlyStoppingCallback(TrainerCallback, ExportableState):
    """Stops training after `early_stopping_patience` evaluations without improvement of the best metric.

    An evaluation improves when it beats `state.best_metric` (strictly, in the direction of
    `greater_is_better`) by more than `early_stopping_threshold`. It runs inside `evaluate()`, before the
    trainer updates `best_metric` for that evaluation. Its counter is saved in checkpoints.
    """

    def __init__(
        self, early_stopping_patience: int = 1, early_stopping_threshold: float | None = 0.0
    ) -> None:
        self.early_stopping_patience = early_stopping_patience
        self.early_stopping_threshold = early_stopping_threshold
        # Number of consecutive evaluations that failed to improve the best metric.
        self.early_stopping_patience_counter = 0

    def check_metric_value(
        self, args: Any, state: TrainerState, control: TrainerControl, metric_value: Any
    ) -> None:
        """Reset the counter on an improvement beyond the threshold, else count one more miss."""
        operator = np.greater if args.greater_is_better else np.less
        if state.best_metric is None or (
            operator(metric_value, state.best_metric)
            and abs(metric_value - state.best_metric) > self.early_stopping_threshold
        ):
            self.early_stopping_patience_counter = 0
        else:
            self.early_stopping_patience_counter += 1

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        if not args.load_best_model_at_end:
            logger.warning(
                "Using EarlyStoppingCallback without load_best_model_at_end=True. "
                "Once training is finished, the best model will not be loaded automatically."
            )
        if args.metric_for_best_model is None:
            raise EarlyStoppingConfigError(
                "EarlyStoppingCallback requires metric_for_best_model to be defined: set "
                "TrainingArguments(metric_for_best_model=...), e.g. 'eval_loss'."
            )
        if enum_value(args.eval_strategy) == "no":
            raise EarlyStoppingConfigError(
                "EarlyStoppingCallback requires IntervalStrategy of steps or epoch: eval_strategy is 'no'; set "
                "eval_strategy='steps' or 'epoch'."
            )

    def on_evaluate(
        self, args: Any, state: TrainerState, control: TrainerControl, metrics: Any, **kwargs: Any
    ) -> Any:
        metric_to_check = args.metric_for_best_model
        if not metric_to_check.startswith("eval_"):
            metric_to_check = f"eval_{metric_to_check}"
        metric_value = metrics.get(metric_to_check)

        if metric_value is None:
            logger.warning(
                f"early stopping required metric_for_best_model, but did not find {metric_to_check} so early stopping"
                " is disabled"
            )
            return

        self.check_metric_value(args, state, control, metric_value)
        if self.early_stopping_patience_counter >= self.early_stopping_patience:
            control.should_training_stop = True

    def state(self) -> dict:
        return {
            "args": {
                "early_stopping_patience": self.early_stopping_patience,
                "early_stopping_threshold": self.early_stopping_threshold,
            },
            "attributes": {
                "early_stopping_patience_counter": self.early_stopping_patience_counter,
            },
        }
