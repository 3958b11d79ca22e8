"""`report_to` -> Lightning loggers: name checks, logger specs (plain dicts), and `build_loggers`.

Decisions: `report_to` maps onto Lightning's loggers, not onto transformers' integration
callbacks, so transformers stays optional. Specs are plain data made by the pure `translate`;
`build_loggers` turns them into Lightning logger objects (importing Lightning and the backends
lazily) when training starts.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hf_lightning.translate import Environment, Plan

# The reference's integration names (spec 6.9), in its order.
REFERENCE_INTEGRATIONS = (
    "azure_ml",
    "clearml",
    "codecarbon",
    "comet_ml",
    "dagshub",
    "dvclive",
    "flyte",
    "kubeflow",
    "mlflow",
    "neptune",
    "swanlab",
    "tensorboard",
    "trackio",
    "wandb",
)
# What hf_lightning reports to; "csv" is our own name (Lightning's CSVLogger, no package needed).
SUPPORTED_LOGGERS = ("tensorboard", "csv", "mlflow", "wandb", "comet_ml")
# Expanded by "all" when their package is installed, in the reference's order.
ALL_EXPANDS_TO = ("comet_ml", "mlflow", "tensorboard", "wandb")
# Python package that must be importable for each logger.
LOGGER_PACKAGES = {
    "tensorboard": "tensorboard (or tensorboardX)",
    "mlflow": "mlflow",
    "wandb": "wandb",
    "comet_ml": "comet_ml",
}
# Non-secret environment variables the specs read (captured by `Environment.detect`).
LOGGER_ENV_VARS = (
    "TENSORBOARD_LOGGING_DIR",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_EXPERIMENT_NAME",
    "WANDB_MODE",
    "WANDB_PROJECT",
    "COMET_PROJECT_NAME",
)
_REASONS = {
    "neptune": "Lightning 2.6 removed NeptuneLogger (Neptune has been sunset)",
}


def _unsupported(name: str) -> str:
    reason = _REASONS.get(name, "hf_lightning reports through Lightning loggers and has none for it")
    return (
        f"report_to={name!r} is not supported ({reason}); supported names: "
        f"{', '.join(SUPPORTED_LOGGERS)}, or 'all' / 'none'"
    )


def requested_loggers(report_to: Any, env: Environment) -> list[str]:
    """Normalise `report_to` into supported logger names, or raise ValueError saying why not."""
    if report_to is None:
        raise ValueError(
            "report_to=None is ambiguous (v4 meant 'all installed', v5 fails on it); "
            "pass report_to='all' or report_to='none'"
        )
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    names = [getattr(name, "value", name) for name in names]
    if None in names:
        raise ValueError(f"report_to={names!r} contains None; pass report_to='all' or report_to='none'")
    if names in (["none"], []):
        return []
    if names == ["all"]:
        return [name for name in ALL_EXPANDS_TO if name in env.installed_loggers]
    result: list[str] = []
    for name in names:
        if name in ("all", "none"):
            raise ValueError(f"report_to={names!r}: {name!r} must be given alone")
        if name not in SUPPORTED_LOGGERS:
            if name in REFERENCE_INTEGRATIONS:
                raise ValueError(_unsupported(name))
            raise ValueError(
                f"report_to={name!r} is not an integration name; supported: {', '.join(SUPPORTED_LOGGERS)}"
            )
        if name in LOGGER_PACKAGES and name not in env.installed_loggers:
            raise ValueError(
                f"report_to={name!r} needs the {LOGGER_PACKAGES[name]} package: install it, "
                f"or remove {name!r} from report_to"
            )
        if name not in result:
            result.append(name)
    return result


def logger_specs(args: Any, env: Environment) -> list[dict[str, Any]]:
    """One spec `{"name", "kwargs", ...}` per requested logger; pure (reads `env.environ`)."""
    output_dir = str(getattr(args, "output_dir", None) or "trainer_output")
    run_name = getattr(args, "run_name", None)
    environ: Mapping[str, str] = env.environ
    specs = []
    for name in requested_loggers(getattr(args, "report_to", "none"), env):
        if name == "tensorboard":
            # The v4 `logging_dir` (kept by our arguments as an attribute) wins over the env var.
            explicit = getattr(args, "logging_dir", None) or environ.get("TENSORBOARD_LOGGING_DIR")
            specs.append(
                {
                    "name": "tensorboard",
                    # name="" and version="" make Lightning write straight into save_dir, as the reference.
                    "kwargs": {
                        "save_dir": os.path.expanduser(explicit) if explicit else None,
                        "name": "",
                        "version": "",
                        "default_hp_metric": False,
                    },
                    # save_dir None: output_dir/runs/<%b%d_%H-%M-%S>_<hostname>, timed when built.
                    "runs_root": output_dir,
                }
            )
        elif name == "csv":
            specs.append({"name": "csv", "kwargs": {"save_dir": output_dir}})
        elif name == "mlflow":
            specs.append(
                {
                    "name": "mlflow",
                    "kwargs": {
                        "experiment_name": environ.get("MLFLOW_EXPERIMENT_NAME", "Default"),
                        "run_name": run_name,
                        "tracking_uri": environ.get("MLFLOW_TRACKING_URI"),
                        "save_dir": os.path.join(output_dir, "mlruns"),
                    },
                }
            )
        elif name == "wandb":
            mode = environ.get("WANDB_MODE")
            specs.append(
                {
                    "name": "wandb",
                    "kwargs": {
                        "name": run_name,
                        "project": environ.get("WANDB_PROJECT", "huggingface"),
                        "save_dir": output_dir,
                        # offline unless the user chose a mode: no network call by surprise
                        "offline": mode is None or mode == "offline",
                    },
                }
            )
        elif name == "comet_ml":
            kwargs: dict[str, Any] = {"project": environ.get("COMET_PROJECT_NAME")}
            if run_name is not None:
                kwargs["name"] = run_name
            specs.append({"name": "comet_ml", "kwargs": kwargs})
    return specs


def default_logdir(now: datetime | None = None) -> str:
    """`runs/<%b%d_%H-%M-%S>_<hostname>`, the reference's TensorBoard default under output_dir."""
    current_time = (now or datetime.now()).strftime("%b%d_%H-%M-%S")
    return os.path.join("runs", current_time + "_" + socket.gethostname())


def build_loggers(plan: Plan, now: datetime | None = None) -> list[Any]:
    """Lightning logger objects for `plan.loggers`; call it when training starts (the reference
    times its TensorBoard directory then). Imports Lightning's logger modules lazily."""
    from lightning.pytorch import loggers as pl_loggers

    classes = {
        "tensorboard": pl_loggers.TensorBoardLogger,
        "csv": pl_loggers.CSVLogger,
        "mlflow": pl_loggers.MLFlowLogger,
        "wandb": pl_loggers.WandbLogger,
        "comet_ml": pl_loggers.CometLogger,
    }
    built = []
    for spec in plan.loggers:
        kwargs = dict(spec["kwargs"])
        if spec["name"] == "tensorboard" and kwargs["save_dir"] is None:
            kwargs["save_dir"] = os.path.join(spec["runs_root"], default_logdir(now))
        built.append(classes[spec["name"]](**kwargs))
    return built


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


def installed_logger_backends(find_spec: Any = None) -> frozenset[str]:
    """Which logger backends are importable (used by `Environment.detect`)."""
    import importlib.util

    find = find_spec or importlib.util.find_spec
    found = set()
    if find("tensorboard") is not None or find("tensorboardX") is not None:
        found.add("tensorboard")
    for name in ("mlflow", "wandb", "comet_ml", "neptune"):
        if find(name) is not None:
            found.add(name)
    return frozenset(found)


def publish_logs(lightning_trainer: Any, logs: Mapping[str, Any], step: int, *, outside_fit: bool) -> None:
    """Send one `log()` entry to Lightning: `callback_metrics` (so Lightning's `ModelCheckpoint` /
    `EarlyStopping` can monitor `eval_loss`) and every logger, with the reference's key rewrite."""
    import torch

    numeric = {
        key: float(value)
        for key, value in logs.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }
    if not numeric:
        return
    callback_metrics = lightning_trainer.callback_metrics
    for key, value in numeric.items():
        callback_metrics[key] = torch.tensor(value)
    rewritten = rewrite_logs(numeric)
    for logger in lightning_trainer.loggers:
        logger.log_metrics(rewritten, step=step)
        if outside_fit:
            # Lightning finalised the loggers when `fit` returned; write what came after.
            logger.save()
