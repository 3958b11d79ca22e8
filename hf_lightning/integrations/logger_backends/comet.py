"""`report_to="comet_ml"`: Lightning's `CometLogger`; `predict()` metrics at `global_step` and `epoch`, as the
reference's `CometCallback.on_predict`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hf_lightning.integrations.logger_backends.base import LoggerBackend, rewrite_logs


class CometBackend(LoggerBackend):
    name = "comet_ml"

    def lightning_class(self) -> type:
        from lightning.pytorch.loggers import CometLogger

        return CometLogger

    def send_predict_metrics(
        self, pl_logger: Any, metrics: Mapping[str, Any], step: int, epoch: float | None = None
    ) -> None:
        # Lightning's CometLogger passes an `epoch` entry on as the experiment's epoch.
        extra = {} if epoch is None else {"epoch": epoch}
        pl_logger.log_metrics({**rewrite_logs(dict(metrics)), **extra}, step=step)
