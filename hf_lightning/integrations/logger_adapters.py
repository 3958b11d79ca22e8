"""What each Lightning logger receives for one `log()` entry, following the reference's integration
callback for that backend (transformers' `integrations/integration_utils.py`):

- TensorBoard, CSV (ours), Comet and any other logger: numbers with the `train/`, `eval/`, `test/`
  key rewrite (`rewrite_logs`) at `global_step`; TensorBoard also gets strings as text, and the
  arguments and model config as text at train begin (`send_run_texts`).
- MLflow: the keys as logged, without a prefix (the reference's `MLflowCallback` does not rewrite),
  characters MLflow refuses replaced by `_`, at `global_step`.
- W&B: `train_runtime`, `train_samples_per_second`, `train_steps_per_second`, `train_loss` and
  `total_flos` go to the run summary; everything else is a history row with the key rewrite plus
  `train/global_step` (Lightning's `WandbLogger` adds its own `trainer/global_step` x-axis).
- `predict()` metrics reach W&B and Comet only, as the reference's `on_predict` (`send_predict_metrics`).

The trainer sends through `publish_logs` (during and after `fit`), `publish_logs_before_training` and
`publish_predict_metrics`; Lightning's loggers write on global rank 0 only.

`isolated_mlflow_logger_class` wraps Lightning's `MLFlowLogger` so that a run leaves MLflow's
process-wide tracking URI as it found it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

# The reference's WandbCallback stores these once in the run summary instead of the history.
WANDB_SUMMARY_KEYS = (
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
    "train_loss",
    "total_flos",
)
# The reference's MLflowCallback replaces these characters in metric names.
_MLFLOW_UNSAFE = re.compile(r"[^0-9A-Za-z_\-\.\ :/]")


def rewrite_logs(logs: Mapping[str, Any]) -> dict[str, Any]:
    """The reference's key rewrite for trackers: `eval_x` -> `eval/x`, `test_x` -> `test/x`,
    anything else -> `train/x`."""
    rewritten = {}
    for key, value in logs.items():
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


def mlflow_metrics(logs: Mapping[str, Any]) -> dict[str, float]:
    """The reference's MLflow row: numeric entries, keys unprefixed with unsupported characters -> `_`."""
    return {_MLFLOW_UNSAFE.sub("_", key): value for key, value in numeric_logs(logs).items()}


def wandb_row(logs: Mapping[str, Any], step: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The reference's W&B split of one entry: (summary updates, history row)."""
    summary = {key: logs[key] for key in WANDB_SUMMARY_KEYS if key in logs}
    history = rewrite_logs({key: value for key, value in logs.items() if key not in WANDB_SUMMARY_KEYS})
    history["train/global_step"] = step
    return summary, history


def send_to_logger(pl_logger: Any, logs: Mapping[str, Any], step: int) -> None:
    """Write one log entry to one Lightning logger the way the reference's integration for it does."""
    from lightning.pytorch import loggers as pl_loggers

    if isinstance(pl_logger, pl_loggers.MLFlowLogger):
        metrics = mlflow_metrics(logs)
        if metrics:
            pl_logger.log_metrics(metrics, step=step)
    elif isinstance(pl_logger, pl_loggers.WandbLogger):
        summary, history = wandb_row(logs, step)
        run = pl_logger.experiment
        for key, value in summary.items():
            run.summary[key] = value
        pl_logger.log_metrics(history, step=step)
    else:
        metrics = rewrite_logs(numeric_logs(logs))
        if metrics:
            pl_logger.log_metrics(metrics, step=step)
        if isinstance(pl_logger, pl_loggers.TensorBoardLogger):
            texts = rewrite_logs({key: value for key, value in logs.items() if isinstance(value, str)})
            for key, value in texts.items():
                pl_logger.experiment.add_text(key, value, step)


def send_predict_metrics(
    pl_logger: Any, metrics: Mapping[str, Any], step: int, epoch: float | None = None
) -> None:
    """`predict()`'s metrics, where the reference's integration has an `on_predict`: W&B logs them with the key
    rewrite at its own step counter, Comet at `global_step` and `epoch`; the other backends get nothing."""
    from lightning.pytorch import loggers as pl_loggers

    if isinstance(pl_logger, pl_loggers.WandbLogger):
        # The reference's `step_sync` on `train/global_step` adds the last step to the row; we add it ourselves.
        pl_logger.experiment.log({**rewrite_logs(dict(metrics)), "train/global_step": step})
    elif isinstance(pl_logger, pl_loggers.CometLogger):
        # Lightning's CometLogger passes an `epoch` entry on as the experiment's epoch.
        extra = {} if epoch is None else {"epoch": epoch}
        pl_logger.log_metrics({**rewrite_logs(dict(metrics)), **extra}, step=step)


def send_run_texts(pl_logger: Any, args: Any, model: Any) -> None:
    """At train begin, the texts the reference's `TensorBoardCallback` writes: `args` (the arguments as JSON,
    tokens redacted by `to_json_string`) and `model_config` when the model has a config. TensorBoard only."""
    from lightning.pytorch import loggers as pl_loggers

    if not isinstance(pl_logger, pl_loggers.TensorBoardLogger):
        return
    pl_logger.experiment.add_text("args", args.to_json_string())
    config = getattr(model, "config", None)
    if config is not None and callable(getattr(config, "to_json_string", None)):
        pl_logger.experiment.add_text("model_config", config.to_json_string())


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


def publish_logs(lightning_trainer: Any, logs: Mapping[str, Any], step: int, *, outside_fit: bool) -> None:
    """Send one `log()` entry to Lightning: `callback_metrics` (so Lightning's `ModelCheckpoint` /
    `EarlyStopping` can monitor `eval_loss`) and every logger, each the way the reference's
    integration for that backend does (see `send_to_logger`)."""
    import torch
    from lightning.pytorch.utilities import rank_zero_only

    numeric = numeric_logs(logs)
    callback_metrics = lightning_trainer.callback_metrics
    for key, value in numeric.items():
        callback_metrics[key] = torch.tensor(value)
    if rank_zero_only.rank != 0:
        return  # Lightning's loggers write on global rank 0 only
    for pl_logger in lightning_trainer.loggers:
        send_to_logger(pl_logger, logs, step)
        if outside_fit:
            # Lightning finalised the loggers when `fit` returned; write what came after.
            pl_logger.save()


def publish_predict_metrics(
    pl_loggers: list[Any], metrics: Mapping[str, Any], step: int, epoch: float | None = None
) -> None:
    """Send `predict()`'s metrics to the loggers whose reference integration logs them (global rank 0)."""
    _on_rank_zero(pl_loggers, lambda pl_logger: send_predict_metrics(pl_logger, metrics, step, epoch))


def publish_logs_before_training(pl_loggers: list[Any], logs: Mapping[str, Any], step: int) -> None:
    """A `log()` entry from before any `train()` (evaluate first): to each logger as `publish_logs` sends it,
    written out at once since no fit will finalise it."""

    def send(pl_logger: Any) -> None:
        send_to_logger(pl_logger, logs, step)
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
