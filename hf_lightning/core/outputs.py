"""Return types of the reference Trainer (named tuples with the same fields), transformers-free."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class TrainOutput(NamedTuple):
    """What `train()` returns: the final global step, the mean training loss and the train metrics."""

    global_step: int
    training_loss: float
    metrics: dict[str, float]


class EvalLoopOutput(NamedTuple):
    """What `evaluation_loop` returns."""

    predictions: np.ndarray | tuple[np.ndarray, ...] | None
    label_ids: np.ndarray | tuple[np.ndarray, ...] | None
    metrics: dict[str, float] | None
    num_samples: int | None


class PredictionOutput(NamedTuple):
    """What `predict()` returns."""

    predictions: np.ndarray | tuple[np.ndarray, ...]
    label_ids: np.ndarray | tuple[np.ndarray, ...] | None
    metrics: dict[str, float] | None


class EvalPrediction:
    """Predictions, labels and optional inputs / losses handed to `compute_metrics` (iterable like the reference)."""

    def __init__(self, predictions: Any, label_ids: Any, inputs: Any = None, losses: Any = None):
        self.predictions = predictions
        self.label_ids = label_ids
        self.inputs = inputs
        self.losses = losses
        self.elements = (self.predictions, self.label_ids)
        if self.inputs is not None:
            self.elements += (self.inputs,)
        if self.losses is not None:
            self.elements += (self.losses,)

    def __iter__(self):
        return iter(self.elements)

    def __getitem__(self, idx):
        if idx < 0 or idx >= len(self.elements):
            raise IndexError("tuple index out of range")
        return self.elements[idx]


class BestRun(NamedTuple):
    """What `hyperparameter_search` returns: the best trial's id (its `run-<id>` folder), objective and parameters.

    `objective` is a list for a multi-objective search; `run_summary` is always None here (the reference fills
    it for Ray Tune only).
    """

    run_id: str
    objective: float | list[float]
    hyperparameters: dict[str, Any]
    run_summary: Any | None = None
