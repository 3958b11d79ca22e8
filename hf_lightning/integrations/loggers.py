"""The run's experiment trackers: the Lightning loggers built from the plan's logger specs when training starts, and
each `log()` entry, `predict()`'s metrics and the run's texts published to them, each the way its backend
(`integrations/logger_backends/`, after the reference's integration for it) says.

The trainer sends through `publish_logs` (during and after `fit`), `publish_logs_before_training`,
`publish_predict_metrics`, `publish_run_texts` and the telemetry's `publish_perf`; Lightning's loggers write on global rank 0 only.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from hf_lightning.integrations.logger_backends import BACKENDS, backend_for
from hf_lightning.integrations.logger_backends.base import numeric_logs

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from hf_lightning.translation.plan import Plan


def build_loggers(plan: Plan, now: datetime | None = None) -> list[Any]:
    """Lightning logger objects for `plan.logging.loggers`; call it when training starts (the reference times its
    TensorBoard directory then). Imports Lightning's logger modules lazily."""
    return [BACKENDS[spec["name"]].build(spec, now) for spec in plan.logging.loggers]


def publish_run_texts(pl_logger: Any, args: Any, model: Any) -> None:
    """At train begin, the texts the reference's integration for `pl_logger` writes (TensorBoard: the arguments and
    the model config)."""
    backend_for(pl_logger).send_run_texts(pl_logger, args, model)


def publish_logs(lightning_trainer: pl.Trainer, logs: Mapping[str, Any], step: int, *, outside_fit: bool) -> None:
    """Send one `log()` entry to Lightning: `callback_metrics` (so Lightning's `ModelCheckpoint` /
    `EarlyStopping` can monitor `eval_loss`) and every logger, each the way the reference's
    integration for that backend does (`logger_backends/`)."""
    import torch
    from lightning.pytorch.utilities import rank_zero_only

    numeric = numeric_logs(logs)
    callback_metrics = lightning_trainer.callback_metrics
    for key, value in numeric.items():
        callback_metrics[key] = torch.tensor(value)
    if rank_zero_only.rank != 0:
        return  # Lightning's loggers write on global rank 0 only
    for pl_logger in lightning_trainer.loggers:
        backend_for(pl_logger).send_logs(pl_logger, logs, step)
        if outside_fit:
            # Lightning finalised the loggers when `fit` returned; write what came after.
            pl_logger.save()


def publish_predict_metrics(
    pl_loggers: list[Any], metrics: Mapping[str, Any], step: int, epoch: float | None = None
) -> None:
    """Send `predict()`'s metrics to the loggers whose reference integration logs them (global rank 0)."""
    _on_rank_zero(
        pl_loggers, lambda pl_logger: backend_for(pl_logger).send_predict_metrics(pl_logger, metrics, step, epoch)
    )


def publish_perf(
    pl_loggers: list[Any], figures: Mapping[str, float], step: int, *, outside_fit: bool = False
) -> None:
    """Send the telemetry's figures (engine/telemetry/) to every logger as `perf/<name>` at `step`, beside the
    reference's keys rather than through their `train/` rewrite (global rank 0). `outside_fit`: written out at
    once, as no fit will finalise the loggers."""
    metrics = {f"perf/{name}": float(value) for name, value in figures.items()}

    def send(pl_logger: Any) -> None:
        pl_logger.log_metrics(metrics, step=step)
        if outside_fit:
            pl_logger.save()

    _on_rank_zero(pl_loggers, send)


def publish_logs_before_training(pl_loggers: list[Any], logs: Mapping[str, Any], step: int) -> None:
    """A `log()` entry from before any `train()` (evaluate first): to each logger as `publish_logs` sends it,
    written out at once since no fit will finalise it."""

    def send(pl_logger: Any) -> None:
        backend_for(pl_logger).send_logs(pl_logger, logs, step)
        pl_logger.save()

    _on_rank_zero(pl_loggers, send)


def _on_rank_zero(pl_loggers: list[Any], send: Any) -> None:
    """`send(logger)` for each logger, on global rank 0 only (where Lightning's loggers write)."""
    if not pl_loggers:
        return  # nothing to import Lightning for
    from lightning.pytorch.utilities import rank_zero_only

    if rank_zero_only.rank == 0:
        for pl_logger in pl_loggers:
            send(pl_logger)
