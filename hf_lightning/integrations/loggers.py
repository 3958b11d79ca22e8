"""Lightning logger objects built from the plan's logger specs (`translation/logger_specs.py`) when training starts.

The TensorBoard folder is timed then (as the reference's), MLflow's SQLite folder is created, and W&B's mode is
decided from the credentials found. Lightning's logger modules and the backends are imported only here, lazily.
"""

from __future__ import annotations

import copy
import logging
import os
import socket
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from hf_lightning.integrations.logger_adapters import isolated_mlflow_logger_class

if TYPE_CHECKING:
    from hf_lightning.translation.plan import Plan

logger = logging.getLogger(__name__)


def default_logdir(now: datetime | None = None) -> str:
    """`runs/<%b%d_%H-%M-%S>_<hostname>`, the reference's TensorBoard default under output_dir."""
    current_time = (now or datetime.now()).strftime("%b%d_%H-%M-%S")
    return os.path.join("runs", current_time + "_" + socket.gethostname())


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


def build_loggers(plan: Plan, now: datetime | None = None) -> list[Any]:
    """Lightning logger objects for `plan.loggers`; call it when training starts (the reference
    times its TensorBoard directory then). Imports Lightning's logger modules lazily."""
    from lightning.pytorch import loggers as pl_loggers

    classes = {
        "tensorboard": pl_loggers.TensorBoardLogger,
        "csv": pl_loggers.CSVLogger,
        "wandb": pl_loggers.WandbLogger,
        "comet_ml": pl_loggers.CometLogger,
    }
    built = []
    for spec in plan.loggers:
        kwargs = copy.deepcopy(spec["kwargs"])  # Lightning's MLFlowLogger adds to the tags it is given
        if spec["name"] == "tensorboard" and kwargs["save_dir"] is None:
            kwargs["save_dir"] = os.path.join(spec["runs_root"], default_logdir(now))
        if spec["name"] == "mlflow" and spec.get("store_dir"):
            os.makedirs(spec["store_dir"], exist_ok=True)
        if spec["name"] == "wandb":
            # Given to wandb.init as `mode`; Lightning's own `offline=True` would rewrite os.environ.
            kwargs["mode"] = resolve_wandb_mode(spec.get("mode"))
        # The MLflow class is made on demand: it imports mlflow.
        logger_class = isolated_mlflow_logger_class() if spec["name"] == "mlflow" else classes[spec["name"]]
        built.append(logger_class(**kwargs))
    return built


