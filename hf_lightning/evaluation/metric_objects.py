"""torchmetrics objects as `compute_metrics`: updated per evaluation batch, computed and reset once per evaluation.

`compute_metrics` may be a torchmetrics `Metric`, a `MetricCollection`, or a dict name -> `Metric` instead of the
reference's callable. The evaluation loop then hands every batch's predictions (after
`preprocess_logits_for_metrics` when given, else the logits) and labels, on the device the model produced them
on, to `MetricCollection.update`; nothing is gathered across processes or kept on the host for the metric
(torchmetrics syncs its states in `compute()`). A bare `Metric` is `MetricCollection([metric])`: reported under
its class name, or under the keys of the dict its `compute()` returns. Values must be scalar or one-element and
become Python floats.

torchmetrics is imported only when the object is one of its classes: a trainer with a callable (or none) never
imports it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = [
    "StreamingMetrics",
    "check_metric_object_arguments",
    "is_metric_object",
    "local_rows_to_keep",
    "streaming_metrics_for",
]

_FIX = (
    "pass a torchmetrics Metric, a MetricCollection, a dict name -> Metric, or a callable taking an "
    "EvalPrediction"
)


def _metric_class() -> type | None:
    """torchmetrics' `Metric` when torchmetrics has been imported (a metric object implies it), else None."""
    module = sys.modules.get("torchmetrics")
    return getattr(module, "Metric", None) if module is not None else None


def is_metric_object(compute_metrics: Any) -> bool:
    """Whether `compute_metrics` is a torchmetrics `Metric` / `MetricCollection` / dict of Metrics, not a callable.

    A dict whose values are not all Metrics is an error naming the first such key (the reference calls
    `compute_metrics`, which a dict cannot be).
    """
    metric_class = _metric_class()
    if isinstance(compute_metrics, Mapping):
        if not compute_metrics:
            raise ValueError(f"compute_metrics={{}}: the dict of metrics is empty; {_FIX}.")
        for name, metric in compute_metrics.items():
            if metric_class is None or not isinstance(metric, metric_class):
                raise ValueError(
                    f"compute_metrics[{name!r}] is a {type(metric).__name__}, not a torchmetrics Metric: a dict of "
                    f"metrics must hold torchmetrics Metric objects only; {_FIX}."
                )
        return True
    if metric_class is None:
        return False
    from torchmetrics import MetricCollection

    return isinstance(compute_metrics, (metric_class, MetricCollection))


def check_metric_object_arguments(
    compute_metrics: Any, batch_eval_metrics: bool, include_for_metrics: Any, tp_size: int = 1
) -> None:
    """Refuse the settings that have no meaning with a metric object (`batch_eval_metrics`, `include_for_metrics`),
    and a tensor-parallel run (`tp_size` > 1), whose metric states would count every sample once per rank."""
    if compute_metrics is None or not is_metric_object(compute_metrics):
        return
    if tp_size > 1:
        raise ValueError(
            f"compute_metrics as metric objects with parallelism_config.tp_size={tp_size} is not supported yet by "
            "hf_lightning (their states would be synced over the tensor-parallel ranks, counting every sample "
            "tp_size times); pass compute_metrics as a function of EvalPrediction instead, or set tp_size=1"
        )
    if batch_eval_metrics:
        raise ValueError(
            "batch_eval_metrics=True with a torchmetrics object as compute_metrics: the metric object is already "
            "updated per batch and computed once at the end of the evaluation. Set batch_eval_metrics=False, or "
            "pass a callable taking `compute_result` instead of the metric object."
        )
    included = list(include_for_metrics or [])
    if included:
        raise ValueError(
            f"include_for_metrics={included!r} with a torchmetrics object as compute_metrics: a metric object is "
            "updated with (predictions, labels) only, so inputs / losses cannot reach it. Set "
            "include_for_metrics=[], or pass a callable compute_metrics that reads EvalPrediction.inputs / .losses."
        )


def local_rows_to_keep(batch_rows: int, is_last_batch: bool, remainder: int, rank: int) -> int:
    """How many of this process's rows of a batch are real samples, so each sample updates the metric once.

    The distributed evaluation sampler completes the last round with samples from the start of the dataset; the
    gathered last round keeps its first `remainder` rows (rank order, every rank holding `batch_rows`). This
    process keeps its share of those: `remainder - rank * batch_rows`, clamped to `[0, batch_rows]`. Other batches
    and an unknown (-1) or zero remainder keep every row.
    """
    if not is_last_batch or remainder <= 0:
        return batch_rows
    return max(0, min(batch_rows, remainder - rank * batch_rows))


def _first_rows(data: Any, rows: int) -> Any:
    if isinstance(data, torch.Tensor):
        return data[:rows]
    if isinstance(data, (list, tuple)):
        items = [_first_rows(item, rows) for item in data]
        return type(data)(*items) if hasattr(data, "_fields") else type(data)(items)
    if isinstance(data, Mapping):
        return type(data)({key: _first_rows(value, rows) for key, value in data.items()})
    return data


def _first_tensor(data: Any) -> torch.Tensor | None:
    if isinstance(data, torch.Tensor):
        return data
    values = data.values() if isinstance(data, Mapping) else data if isinstance(data, (list, tuple)) else ()
    for value in values:
        found = _first_tensor(value)
        if found is not None:
            return found
    return None


def _as_number(key: str, value: Any) -> float:
    """A metric value as a Python float; anything but a scalar or a one-element tensor / array is an error."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        elements = value.size if isinstance(value, np.ndarray) else value.numel()
        if elements == 1:
            return float(value.item())
        raise ValueError(
            f"compute_metrics: the metric value {key!r} has shape {tuple(value.shape)}; only scalar or one-element "
            "values can be reported (logged, compared for metric_for_best_model). Reduce it in the metric (for "
            "example average='macro'), or wrap the metric in torchmetrics' ClasswiseWrapper to report one value "
            "per class under its own name."
        )
    if isinstance(value, (bool, int, float, np.number)):
        return float(value)
    raise ValueError(
        f"compute_metrics: the metric value {key!r} is a {type(value).__name__}; a torchmetrics metric must compute "
        "a number or a one-element tensor (or a dict of them)."
    )


class StreamingMetrics:
    """One evaluation's torchmetrics collection: `reset()`, `update()` per batch, `compute()` (then reset)."""

    def __init__(self, compute_metrics: Any) -> None:
        from torchmetrics import Metric, MetricCollection

        if isinstance(compute_metrics, MetricCollection):
            self.collection = compute_metrics
        elif isinstance(compute_metrics, Metric):
            self.collection = MetricCollection([compute_metrics])
        else:
            self.collection = MetricCollection(dict(compute_metrics))
        # A MetricCollection sorts a dict's names; a plain dict is reported in the user's order.
        self._order = list(compute_metrics) if isinstance(compute_metrics, Mapping) else []
        self._on_device = False

    def reset(self) -> None:
        """Clear every state (before the first update: an interrupted evaluation leaves none behind)."""
        self.collection.reset()
        self._on_device = False

    def update(self, predictions: Any, labels: Any, rows: int | None = None) -> None:
        """Update with the first `rows` rows (all when None) of one batch, on the device of the predictions."""
        if rows is not None:
            if rows == 0:
                return
            predictions, labels = _first_rows(predictions, rows), _first_rows(labels, rows)
        if not self._on_device:
            tensor = _first_tensor(predictions)
            if tensor is not None:
                self.collection.to(tensor.device)
            self._on_device = True
        self.collection.update(predictions, labels)

    def compute(self) -> dict[str, float]:
        """Every value of the collection (synced across processes by torchmetrics) as Python floats, then reset."""
        try:
            values = self.collection.compute()
        finally:
            self.reset()
        ordered = [key for key in self._order if key in values] + [k for k in values if k not in self._order]
        return {key: _as_number(key, values[key]) for key in ordered}


def streaming_metrics_for(compute_metrics: Any, settings: Any, tp_size: int = 1) -> StreamingMetrics | None:
    """The `StreamingMetrics` of a metric-object `compute_metrics` (checked against the plan's evaluation
    `settings`), None for a callable."""
    if compute_metrics is None or not is_metric_object(compute_metrics):
        return None
    check_metric_object_arguments(compute_metrics, settings.batch_eval_metrics, settings.include_for_metrics, tp_size)
    return StreamingMetrics(compute_metrics)
