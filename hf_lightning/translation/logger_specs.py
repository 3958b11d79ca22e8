"""`report_to` -> who carries each tracker, and one plain-dict spec per Lightning logger, made by the pure `translate`.

The carrier rule (docs/design.md, "Who carries report_to"): with transformers importable, each of the reference's
twelve integration names is carried by the reference's own integration callback (`INTEGRATION_TO_CALLBACK`), which
our callback system runs with the reference's state and control, so the tracker records what the reference records;
the plan lists those names in `plan.logging.integrations` and the trainer attaches the callbacks
(`integrations/reporting_callbacks.py`). Without transformers, or with `HF_LIGHTNING_REPORT_THROUGH=lightning`,
Lightning's loggers carry the four that have one (tensorboard, mlflow, wandb, comet_ml) and the other eight are
refused naming what to install. `csv` (ours) is always Lightning's `CSVLogger`.

Lightning logger specs are the plan's `logging.loggers`; `hf_lightning/integrations/loggers.py` builds the Lightning
logger objects from them when training starts. What each backend receives per log entry follows the reference's
integration callback for it (`integrations/logger_backends/`).

Where each Lightning backend writes, and which environment variables are read (all captured, non-secret,
by `Environment.detect`):
- tensorboard: `logging_dir` (v4 name), else `TENSORBOARD_LOGGING_DIR`, else
  `output_dir/runs/<%b%d_%H-%M-%S>_<hostname>` (the reference's default).
- csv (ours, no package needed): `logging_dir`, else `output_dir`, under `lightning_logs/version_N/metrics.csv`.
- mlflow: `MLFLOW_TRACKING_URI`, else `sqlite:///<output_dir>/mlflow.db`. MLflow 3 refuses the
  `./mlruns` file store unless `MLFLOW_ALLOW_FILE_STORE=true` and defaults to SQLite itself; the
  reference leaves the URI to MLflow (so `./mlflow.db` in the working directory), we keep the run
  inside `output_dir` like TensorBoard's `runs/`. `MLFLOW_EXPERIMENT_NAME` (default experiment
  "Default"), `MLFLOW_TAGS` (a JSON object), `MLFLOW_RUN_ID` (resume a run) are honoured;
  `MLFLOW_NESTED_RUN` and `HF_MLFLOW_LOG_ARTIFACTS` are refused (the reference's callback carries them).
  Lightning's `MLFlowLogger` accepts `mlflow-skinny` (its requirement check falls back to "the `mlflow` module
  imports").
- wandb: `WANDB_PROJECT` (default "huggingface"), `WANDB_DIR` (default `output_dir`), `WANDB_MODE`
  passed to `wandb.init(mode=...)` as given; unset, the run is online when W&B credentials are
  configured (`WANDB_API_KEY`, `WANDB_IDENTITY_TOKEN_FILE` or a .netrc entry) and offline otherwise,
  so a machine without a key never prompts. `WANDB_LOG_MODEL` / `WANDB_WATCH` are refused (the reference's
  callback carries them).
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
# The twelve names the reference's own integration callbacks carry when transformers is importable, in the order of
# the reference's `get_available_reporting_integrations` ("all").
CALLBACK_INTEGRATIONS = (
    "azure_ml",
    "comet_ml",
    "dagshub",
    "dvclive",
    "mlflow",
    "tensorboard",
    "wandb",
    "codecarbon",
    "clearml",
    "swanlab",
    "trackio",
    "flyte",
)
# What our Lightning loggers carry; "csv" is our own name (Lightning's CSVLogger, no package needed).
SUPPORTED_LOGGERS = ("tensorboard", "csv", "mlflow", "wandb", "comet_ml")
# Expanded by "all" when their package is installed and Lightning's loggers carry them, in the reference's order.
ALL_EXPANDS_TO = ("comet_ml", "mlflow", "tensorboard", "wandb")
# Python package that must be importable for each integration, and how to install it.
LOGGER_PACKAGES = {
    "tensorboard": ("tensorboard (or tensorboardX)", "pip install tensorboard"),
    "mlflow": ("mlflow (or mlflow-skinny)", "pip install mlflow-skinny"),
    "wandb": ("wandb", "pip install wandb"),
    "comet_ml": ("comet_ml", "pip install comet-ml"),
    "azure_ml": ("azureml-core", "pip install azureml-core"),
    "clearml": ("clearml", "pip install clearml"),
    "codecarbon": ("codecarbon", "pip install codecarbon"),
    "dagshub": ("dagshub and mlflow", "pip install dagshub mlflow"),
    "dvclive": ("dvclive", "pip install dvclive"),
    "flyte": ("flytekit", "pip install flytekit"),
    "swanlab": ("swanlab", "pip install swanlab"),
    "trackio": ("trackio", "pip install trackio"),
}
# `HF_LIGHTNING_REPORT_THROUGH`: who carries the twelve names ("reference": transformers' integration callbacks,
# the default when transformers is importable; "lightning": our Lightning loggers).
REPORT_THROUGH_VAR = "HF_LIGHTNING_REPORT_THROUGH"
REPORT_THROUGH = ("reference", "lightning")
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


def report_through(env: Environment) -> str:
    """"reference" when the reference's integration callbacks carry the twelve names, else "lightning"; raises
    ValueError for a bad `HF_LIGHTNING_REPORT_THROUGH` or "reference" without transformers."""
    chosen = (env.environ.get(REPORT_THROUGH_VAR) or "").strip().lower()
    if chosen and chosen not in REPORT_THROUGH:
        raise ValueError(
            f"{REPORT_THROUGH_VAR}={env.environ[REPORT_THROUGH_VAR]!r} is not one of {', '.join(REPORT_THROUGH)}; "
            "unset it (the reference's integration callbacks when transformers is installed)"
        )
    if chosen == "reference" and not env.reference_integrations:
        raise ValueError(
            f"{REPORT_THROUGH_VAR}=reference needs transformers, which is not importable: "
            "`pip install 'transformers==5.24.*'`, or unset it"
        )
    if chosen == "lightning" or not env.reference_integrations:
        return "lightning"
    return "reference"


def _no_lightning_logger(name: str, env: Environment) -> str:
    callback = f"transformers' {name} integration callback"
    package, command = LOGGER_PACKAGES[name]
    if env.reference_integrations:
        how = f"unset {REPORT_THROUGH_VAR} so that {callback} carries it"
    else:
        how = f"install transformers (`pip install 'transformers==5.24.*'`) and {package} (`{command}`) so that {callback} carries it"
    return (
        f"report_to={name!r} has no Lightning logger (Lightning has none for it); {how}, or remove {name!r} from "
        "report_to"
    )


def _unsupported(name: str) -> str:
    reason = _REASONS.get(name, "hf_lightning has no carrier for it")
    return (
        f"report_to={name!r} is not supported ({reason}); remove it from report_to (supported names: "
        f"{', '.join(CALLBACK_INTEGRATIONS)} through transformers' integration callbacks, {', '.join(SUPPORTED_LOGGERS)} "
        "through Lightning's loggers, or 'all' / 'none'; TrainingArguments expands report_to='all' "
        "to every installed integration, so list the ones you want instead)"
    )


def report_to_of(args: Any, env: Environment) -> Any:
    """`args.report_to`, but a list our TrainingArguments expanded from "all" keeps, when Lightning's loggers carry
    the run, only the names they can carry (an installed tracker without a Lightning logger is not an error there)."""
    report_to = getattr(args, "report_to", "none")
    expanded = getattr(args, "_report_to_expanded_from_all", None)
    if expanded is not None and report_to == expanded and report_through(env) == "lightning":
        return [name for name in report_to if name in SUPPORTED_LOGGERS]
    return report_to


def requested_loggers(report_to: Any, env: Environment) -> list[str]:
    """Normalise `report_to` into the accepted integration names (any carrier), or raise ValueError saying why not."""
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
    through = report_through(env)
    if names == ["all"]:
        return _all_installed(env, through)
    accepted = CALLBACK_INTEGRATIONS + ("csv",) if through == "reference" else SUPPORTED_LOGGERS
    result: list[str] = []
    for name in names:
        if name in ("all", "none"):
            raise ValueError(f"report_to={names!r}: {name!r} must be given alone")
        if name not in accepted:
            if name in CALLBACK_INTEGRATIONS:
                raise ValueError(_no_lightning_logger(name, env))
            if name in REFERENCE_INTEGRATIONS:
                raise ValueError(_unsupported(name))
            raise ValueError(
                f"report_to={name!r} is not an integration name; supported: "
                f"{', '.join(sorted(set(CALLBACK_INTEGRATIONS) | set(SUPPORTED_LOGGERS)))}"
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


def _all_installed(env: Environment, through: str) -> list[str]:
    """An unexpanded "all" (duck-typed arguments): the installed names the carrier takes, in the reference's order
    (azure_ml only without MLflow, as the reference's expansion)."""
    if through == "lightning":
        return [name for name in ALL_EXPANDS_TO if name in env.installed_loggers]
    names = [name for name in CALLBACK_INTEGRATIONS if name in env.installed_loggers]
    return [name for name in names if not (name == "azure_ml" and "mlflow" in env.installed_loggers)]


def reference_integrations(report_to: Any, env: Environment) -> list[str]:
    """The `report_to` names the reference's own integration callbacks carry (none without transformers)."""
    names = requested_loggers(report_to, env)
    if report_through(env) == "lightning":
        return []
    return [name for name in names if name in CALLBACK_INTEGRATIONS]


def lightning_logger_names(report_to: Any, env: Environment) -> list[str]:
    """The `report_to` names our Lightning loggers carry: `csv`, and the four when the reference's callbacks don't."""
    names = requested_loggers(report_to, env)
    if report_through(env) == "reference":
        return [name for name in names if name not in CALLBACK_INTEGRATIONS]
    return names


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
    """One spec `{"name", "kwargs", ...}` per Lightning logger the run reports to; pure (reads `env.environ`)."""
    output_dir = str(getattr(args, "output_dir", None) or "trainer_output")
    logging_dir = getattr(args, "logging_dir", None)
    run_name = getattr(args, "run_name", None)
    return [
        _SPECS[name](output_dir, logging_dir, run_name, env.environ)
        for name in lightning_logger_names(report_to_of(args, env), env)
    ]
