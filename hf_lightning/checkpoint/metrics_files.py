"""`metrics_format`: the reference Trainer's human-readable metrics (the facade's `log_metrics` prints them).

Same strings as transformers' `trainer_pt_utils` (METRICS-8), without importing it.
"""

from __future__ import annotations

import datetime
from typing import Any


def _secs2timedelta(secs: float) -> str:
    """`H:MM:SS.cc`: whole seconds as a timedelta, then the hundredths truncated (not rounded)."""
    msec = int(abs(secs - int(secs)) * 100)
    return f"{datetime.timedelta(seconds=int(secs))}.{msec:02d}"


def metrics_format(metrics: dict[str, Any]) -> dict[str, Any]:
    """A human-readable copy of `metrics`: memory in MB, runtimes as `H:MM:SS.cc`, flos in GF, floats rounded."""
    metrics_copy = metrics.copy()
    for key, value in metrics_copy.items():
        if "_mem_" in key:
            metrics_copy[key] = f"{value >> 20}MB"
        elif "_runtime" in key:
            metrics_copy[key] = _secs2timedelta(value)
        elif key == "total_flos":
            metrics_copy[key] = f"{int(value) >> 30}GF"
        elif isinstance(value, float):
            metrics_copy[key] = round(value, 4)
    return metrics_copy
