"""What every tracker receives unless its backend says otherwise, and the reference's key conventions."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import datetime
from typing import Any


def rewrite_logs(logs: Mapping[str, Any]) -> dict[str, Any]:
    """The reference's key rewrite for trackers: `eval_x` -> `eval/x`, `test_x` -> `test/x`,
    anything else -> `train/x`; but `perf/x`, the telemetry's figures (engine/telemetry/), stays `perf/x`, the key
    they have when not in the log entry (docs/divergences.md)."""
    rewritten = {}
    for key, value in logs.items():
        if key.startswith("perf/"):
            rewritten[key] = value
            continue
        for prefix in ("eval_", "test_"):
            if key.startswith(prefix):
                rewritten[prefix[:-1] + "/" + key[len(prefix) :]] = value
                break
        else:
            rewritten["train/" + key] = value
    return rewritten


def numeric_logs(logs: Mapping[str, Any]) -> dict[str, float]:
    """The entries a metric store accepts, as floats: ints and floats (bools too, as the reference's
    `isinstance(v, (int, float))` test lets them through)."""
    return {key: float(value) for key, value in logs.items() if isinstance(value, (int, float))}


class LoggerBackend:
    """The generic tracker (and any logger of `lightning_trainer_overrides`): numbers with the `train/`, `eval/`,
    `test/` key rewrite at `global_step`; no `predict()` metrics, no run texts."""

    name = ""

    def lightning_class(self) -> type | None:
        """The Lightning logger class this backend builds and recognises (imported on use); None: generic."""
        return None

    def owns(self, pl_logger: Any) -> bool:
        """Whether `pl_logger` is this backend's logger."""
        logger_class = self.lightning_class()
        return logger_class is not None and isinstance(pl_logger, logger_class)

    def build(self, spec: Mapping[str, Any], now: datetime | None = None) -> Any:
        """The Lightning logger of a plan's spec, when training starts."""
        return self.lightning_class()(**copy.deepcopy(spec["kwargs"]))

    def send_logs(self, pl_logger: Any, logs: Mapping[str, Any], step: int) -> None:
        """One `log()` entry, at `global_step`."""
        metrics = rewrite_logs(numeric_logs(logs))
        if metrics:
            pl_logger.log_metrics(metrics, step=step)

    def send_predict_metrics(
        self, pl_logger: Any, metrics: Mapping[str, Any], step: int, epoch: float | None = None
    ) -> None:
        """`predict()`'s metrics, where the reference's integration has an `on_predict`; nothing here."""

    def send_run_texts(self, pl_logger: Any, args: Any, model: Any) -> None:
        """At train begin, texts the reference's integration writes; nothing here."""
