"""`report_to="mlflow"`: Lightning's `MLFlowLogger` in a subclass that leaves MLflow's process-wide tracking URI as
it found it, the default SQLite store's folder created when built; the keys as logged, without a prefix, characters
MLflow refuses replaced by `_` (the reference's `MLflowCallback` does not rewrite)."""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from hf_lightning.integrations.logger_backends.base import LoggerBackend, numeric_logs

# The reference's MLflowCallback replaces these characters in metric names.
_MLFLOW_UNSAFE = re.compile(r"[^0-9A-Za-z_\-\.\ :/]")


def mlflow_metrics(logs: Mapping[str, Any]) -> dict[str, float]:
    """The reference's MLflow row: numeric entries, keys unprefixed with unsupported characters -> `_`."""
    return {_MLFLOW_UNSAFE.sub("_", key): value for key, value in numeric_logs(logs).items()}


def isolated_mlflow_logger_class() -> type:
    """Lightning's `MLFlowLogger`, minus one process-wide side effect: its first use calls
    `mlflow.set_tracking_uri`, which MLflow also exports as `os.environ["MLFLOW_TRACKING_URI"]`, so the
    next run of the same process (a notebook, an HP search) would read it and write into this run's
    store. The subclass restores both once its client is set up (it logs through that client only)."""
    import mlflow
    from lightning.pytorch.loggers import MLFlowLogger

    class IsolatedMLFlowLogger(MLFlowLogger):
        @property
        def experiment(self) -> Any:
            if self._initialized:
                return super().experiment
            saved_env = os.environ.get("MLFLOW_TRACKING_URI")
            # MLflow keeps the URI set by `set_tracking_uri` in this module global (None when unset).
            saved_uri = getattr(mlflow.tracking._tracking_service.utils, "_tracking_uri", None)
            try:
                return super().experiment
            finally:
                mlflow.set_tracking_uri(saved_uri)  # None also removes the environment variable
                if saved_env is None:
                    os.environ.pop("MLFLOW_TRACKING_URI", None)
                else:
                    os.environ["MLFLOW_TRACKING_URI"] = saved_env

    return IsolatedMLFlowLogger


class MLflowBackend(LoggerBackend):
    name = "mlflow"

    def lightning_class(self) -> type:
        # Recognising any MLFlowLogger needs only Lightning's class (mlflow itself is imported when one is built).
        from lightning.pytorch.loggers import MLFlowLogger

        return MLFlowLogger

    def build(self, spec: Mapping[str, Any], now: datetime | None = None) -> Any:
        if spec.get("store_dir"):  # the default SQLite file's folder (SQLite does not create it)
            os.makedirs(spec["store_dir"], exist_ok=True)
        # A copy: Lightning's MLFlowLogger adds to the tags it is given.
        return isolated_mlflow_logger_class()(**copy.deepcopy(spec["kwargs"]))

    def send_logs(self, pl_logger: Any, logs: Mapping[str, Any], step: int) -> None:
        metrics = mlflow_metrics(logs)
        if metrics:
            pl_logger.log_metrics(metrics, step=step)
