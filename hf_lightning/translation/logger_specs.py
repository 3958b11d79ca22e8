"""`report_to` -> logger specs: the name checks and one plain-dict spec per logger, made by the pure `translate`.

The specs are the plan's logging section; `hf_lightning/integrations/loggers.py` builds the Lightning logger objects
from them when training starts.

Decisions: `report_to` maps onto Lightning's loggers, not onto transformers' integration
callbacks, so transformers stays optional. Specs are plain data made by the pure `translate`;
`build_loggers` turns them into Lightning logger objects (importing Lightning and the backends
lazily) when training starts. What each backend receives per log entry follows the reference's
integration callback for it (`integrations/logger_backends/`).

Where each backend writes, and which environment variables are read (all captured, non-secret,
by `Environment.detect`):
- tensorboard: `logging_dir` (v4 name), else `TENSORBOARD_LOGGING_DIR`, else
  `output_dir/runs/<%b%d_%H-%M-%S>_<hostname>` (the reference's default).
- csv (ours, no package needed): `logging_dir`, else `output_dir`, under `lightning_logs/version_N/metrics.csv`.
- mlflow: `MLFLOW_TRACKING_URI`, else `sqlite:///<output_dir>/mlflow.db`. MLflow 3 refuses the
  `./mlruns` file store unless `MLFLOW_ALLOW_FILE_STORE=true` and defaults to SQLite itself; the
  reference leaves the URI to MLflow (so `./mlflow.db` in the working directory), we keep the run
  inside `output_dir` like TensorBoard's `runs/`. `MLFLOW_EXPERIMENT_NAME` (default experiment
  "Default"), `MLFLOW_TAGS` (a JSON object), `MLFLOW_RUN_ID` (resume a run) are honoured;
  `MLFLOW_NESTED_RUN` and `HF_MLFLOW_LOG_ARTIFACTS` are refused. Lightning's `MLFlowLogger` accepts
  `mlflow-skinny` (its requirement check falls back to "the `mlflow` module imports").
- wandb: `WANDB_PROJECT` (default "huggingface"), `WANDB_DIR` (default `output_dir`), `WANDB_MODE`
  passed to `wandb.init(mode=...)` as given; unset, the run is online when W&B credentials are
  configured (`WANDB_API_KEY`, `WANDB_IDENTITY_TOKEN_FILE` or a .netrc entry) and offline otherwise,
  so a machine without a key never prompts. `WANDB_LOG_MODEL` / `WANDB_WATCH` are refused.
- comet_ml: `COMET_PROJECT_NAME` and `COMET_MODE`; comet reads its own key from its configuration.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hf_lightning.core.enums import enum_value

if TYPE_CHECKING:
    from hf_lightning.translation.environment import Environment

# The reference's integration names (R6.9), in its order.
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
# Python package that must be importable for each logger, and how to install it.
LOGGER_PACKAGES = {
    "tensorboard": ("tensorboard (or tensorboardX)", "pip install tensorboard"),
    "mlflow": ("mlflow (or mlflow-skinny)", "pip install mlflow-skinny"),
    "wandb": ("wandb", "pip install wandb"),
    "comet_ml": ("comet_ml", "pip install comet-ml"),
}
# `wandb.init(mode=...)` values (wandb 0.19+; "dryrun" and "run" are its older spellings).
WANDB_MODES = ("online", "offline", "disabled", "shared", "dryrun", "run")
_FALSY = ("", "false", "0", "no", "off")
_REASONS = {
    "neptune": "Lightning 2.6 removed NeptuneLogger when Neptune was sunset",
    "kubeflow": (
        "hf_lightning has no Kubeflow progress reporter; TrainingArguments adds it when "
        "KUBEFLOW_TRAINER_SERVER_URL is set, set DISABLE_KUBEFLOW_INTEGRATION=TRUE to opt out"
    ),
}


def _unsupported(name: str) -> str:
    reason = _REASONS.get(name, "hf_lightning reports through Lightning loggers and has none for it")
    return (
        f"report_to={name!r} is not supported ({reason}); remove it from report_to (supported names: "
        f"{', '.join(SUPPORTED_LOGGERS)}, or 'all' / 'none'; TrainingArguments expands report_to='all' "
        "to every installed integration, so list the ones you want instead)"
    )


def requested_loggers(report_to: Any, env: Environment) -> list[str]:
    """Normalise `report_to` into supported logger names, or raise ValueError saying why not."""
    if report_to is None:
        raise ValueError(
            "report_to=None is ambiguous (v4 meant 'all installed', v5 fails on it); "
            "pass report_to='all' or report_to='none'"
        )
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    names = [enum_value(name) for name in names]
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
            package, command = LOGGER_PACKAGES[name]
            raise ValueError(
                f"report_to={name!r} needs the {package} package, which is not installed: install it "
                f"(`{command}`), or remove {name!r} from report_to"
            )
        if name not in result:
            result.append(name)
    return result


def default_mlflow_tracking_uri(output_dir: str) -> str:
    """`sqlite:///<absolute output_dir>/mlflow.db`: MLflow's own default store format, kept inside the run."""
    return "sqlite:///" + os.path.join(os.path.abspath(output_dir), "mlflow.db")


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in _FALSY


def _mlflow_spec(output_dir: str, run_name: str | None, environ: Mapping[str, str]) -> dict[str, Any]:
    for name, effect in (
        ("MLFLOW_NESTED_RUN", "nested runs"),
        ("HF_MLFLOW_LOG_ARTIFACTS", "copying checkpoints to MLflow artifacts"),
    ):
        if _truthy(environ.get(name)):
            raise ValueError(
                f"report_to='mlflow' with {name}={environ[name]!r} ({effect}) is not supported by "
                f"hf_lightning's MLflow logger; unset {name}"
            )
    tags = None
    if environ.get("MLFLOW_TAGS"):
        try:
            tags = json.loads(environ["MLFLOW_TAGS"])
        except json.JSONDecodeError as error:
            raise ValueError(
                f"MLFLOW_TAGS={environ['MLFLOW_TAGS']!r} is not JSON ({error}); pass a JSON object"
            ) from None
        if not isinstance(tags, dict):
            raise ValueError(f"MLFLOW_TAGS={environ['MLFLOW_TAGS']!r} must be a JSON object of tag: value")
        tags = {str(key): str(value) for key, value in tags.items()}
    explicit_uri = environ.get("MLFLOW_TRACKING_URI")
    return {
        "name": "mlflow",
        "kwargs": {
            "experiment_name": environ.get("MLFLOW_EXPERIMENT_NAME") or "Default",
            "run_name": run_name,
            "tracking_uri": explicit_uri or default_mlflow_tracking_uri(output_dir),
            "tags": tags,
            "run_id": environ.get("MLFLOW_RUN_ID") or None,
        },
        # The default SQLite file's folder is created when the logger is built (SQLite does not).
        "store_dir": None if explicit_uri else os.path.abspath(output_dir),
    }


def _wandb_spec(output_dir: str, run_name: str | None, environ: Mapping[str, str]) -> dict[str, Any]:
    mode = environ.get("WANDB_MODE") or None
    if mode is not None and mode not in WANDB_MODES:
        raise ValueError(f"WANDB_MODE={mode!r} is not a W&B mode; use one of {', '.join(WANDB_MODES)}")
    for name, effect in (("WANDB_LOG_MODEL", "uploading the model"), ("WANDB_WATCH", "watching gradients")):
        if _truthy(environ.get(name)):
            raise ValueError(
                f"report_to='wandb' with {name}={environ[name]!r} ({effect}) is not supported by "
                f"hf_lightning's W&B logger; unset {name} or set it to 'false'"
            )
    return {
        "name": "wandb",
        "kwargs": {
            "name": run_name,
            "project": environ.get("WANDB_PROJECT") or "huggingface",
            # None lets wandb read WANDB_DIR itself.
            "save_dir": None if environ.get("WANDB_DIR") else output_dir,
        },
        # None: online when credentials are configured, else offline (decided when built).
        "mode": mode,
    }


def _tensorboard_spec(
    output_dir: str, logging_dir: str | None, run_name: str | None, environ: Mapping[str, str]
) -> dict[str, Any]:
    # The v4 `logging_dir` (kept by our arguments as an attribute) wins over the env var.
    explicit = logging_dir or environ.get("TENSORBOARD_LOGGING_DIR")
    return {
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


def _csv_spec(
    output_dir: str, logging_dir: str | None, run_name: str | None, environ: Mapping[str, str]
) -> dict[str, Any]:
    return {"name": "csv", "kwargs": {"save_dir": os.path.expanduser(logging_dir or output_dir)}}


def _comet_spec(
    output_dir: str, logging_dir: str | None, run_name: str | None, environ: Mapping[str, str]
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"project": environ.get("COMET_PROJECT_NAME")}
    mode = environ.get("COMET_MODE")
    if mode:
        if mode.lower() not in ("get", "get_or_create", "create"):
            raise ValueError(f"COMET_MODE={mode!r} is not one of 'get', 'get_or_create', 'create'")
        kwargs["mode"] = mode.lower()
    if run_name is not None:
        kwargs["name"] = run_name
    return {"name": "comet_ml", "kwargs": kwargs}


# Each supported backend's spec, from (output_dir, logging_dir, run_name, environ); its run-time side is
# `integrations/logger_backends/<name>.py`.
_SPECS = {
    "tensorboard": _tensorboard_spec,
    "csv": _csv_spec,
    "mlflow": lambda output_dir, logging_dir, run_name, environ: _mlflow_spec(output_dir, run_name, environ),
    "wandb": lambda output_dir, logging_dir, run_name, environ: _wandb_spec(output_dir, run_name, environ),
    "comet_ml": _comet_spec,
}


def logger_specs(args: Any, env: Environment) -> list[dict[str, Any]]:
    """One spec `{"name", "kwargs", ...}` per requested logger; pure (reads `env.environ`)."""
    output_dir = str(getattr(args, "output_dir", None) or "trainer_output")
    logging_dir = getattr(args, "logging_dir", None)
    run_name = getattr(args, "run_name", None)
    return [
        _SPECS[name](output_dir, logging_dir, run_name, env.environ)
        for name in requested_loggers(getattr(args, "report_to", "none"), env)
    ]
