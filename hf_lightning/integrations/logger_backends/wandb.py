"""`report_to="wandb"`: Lightning's `WandbLogger`, its `wandb.init(mode=...)` decided when built (the user's
`WANDB_MODE`, else online only where credentials are configured, so a machine without a key never prompts);
`train_runtime`, `train_samples_per_second`, `train_steps_per_second`, `train_loss` and `total_flos` go to the run
summary and everything else to a history row with the key rewrite plus `train/global_step`; `predict()` metrics
logged at W&B's own step, as the reference's `WandbCallback`."""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from hf_lightning.integrations.logger_backends.base import LoggerBackend, rewrite_logs

logger = logging.getLogger(__name__)

# The reference's WandbCallback stores these once in the run summary instead of the history.
WANDB_SUMMARY_KEYS = (
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
    "train_loss",
    "total_flos",
)


def wandb_row(logs: Mapping[str, Any], step: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The reference's W&B split of one entry: (summary updates, history row)."""
    summary = {key: logs[key] for key in WANDB_SUMMARY_KEYS if key in logs}
    history = rewrite_logs({key: value for key, value in logs.items() if key not in WANDB_SUMMARY_KEYS})
    history["train/global_step"] = step
    return summary, history


def wandb_credentials_configured(environ: Mapping[str, str] | None = None) -> bool:
    """True when W&B would find credentials without prompting: an API key or identity-token variable,
    or a .netrc entry for the W&B host. Only presence is checked; no value is read into a log."""
    import netrc
    from urllib.parse import urlparse

    environ = os.environ if environ is None else environ
    if environ.get("WANDB_API_KEY") or environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    # wandb's own lookup: the NETRC variable, else ~/.netrc, else ~/_netrc; the machine is the host's netloc.
    machine = urlparse(environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").netloc
    home = os.path.expanduser("~")
    candidates = (
        [os.path.expanduser(environ["NETRC"])]
        if environ.get("NETRC")
        else [
            os.path.join(home, ".netrc"),
            os.path.join(home, "_netrc"),
        ]
    )
    for path in candidates:
        if os.path.isfile(path):
            try:
                return netrc.netrc(path).authenticators(machine) is not None
            except (netrc.NetrcParseError, OSError):
                return False
    return False


def resolve_wandb_mode(mode: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The `wandb.init(mode=...)` of a run: the user's `WANDB_MODE`, else online only with credentials."""
    if mode is not None:
        return mode
    if wandb_credentials_configured(environ):
        return "online"
    logger.info(
        "report_to='wandb': no W&B credentials configured and WANDB_MODE unset, so the run is recorded "
        "offline; upload it later with `wandb sync <run dir>`, or set WANDB_MODE / run `wandb login`."
    )
    return "offline"


class WandbBackend(LoggerBackend):
    name = "wandb"

    def lightning_class(self) -> type:
        from lightning.pytorch.loggers import WandbLogger

        return WandbLogger

    def build(self, spec: Mapping[str, Any], now: datetime | None = None) -> Any:
        kwargs = copy.deepcopy(spec["kwargs"])
        # Given to wandb.init as `mode`; Lightning's own `offline=True` would rewrite os.environ.
        kwargs["mode"] = resolve_wandb_mode(spec.get("mode"))
        return self.lightning_class()(**kwargs)

    def send_logs(self, pl_logger: Any, logs: Mapping[str, Any], step: int) -> None:
        summary, history = wandb_row(logs, step)
        run = pl_logger.experiment
        for key, value in summary.items():
            run.summary[key] = value
        pl_logger.log_metrics(history, step=step)

    def send_predict_metrics(
        self, pl_logger: Any, metrics: Mapping[str, Any], step: int, epoch: float | None = None
    ) -> None:
        # The reference's `step_sync` on `train/global_step` adds the last step to the row; we add it ourselves.
        pl_logger.experiment.log({**rewrite_logs(dict(metrics)), "train/global_step": step})
