"""`report_to="csv"` (ours, no package needed): Lightning's `CSVLogger`, the generic entries."""

from __future__ import annotations

from hf_lightning.integrations.logger_backends.base import LoggerBackend


class CSVBackend(LoggerBackend):
    name = "csv"

    def lightning_class(self) -> type:
        from lightning.pytorch.loggers import CSVLogger

        return CSVLogger
