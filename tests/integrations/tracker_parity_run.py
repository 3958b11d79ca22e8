"""One side of a tracker parity run, in its own process: `python -m tests.integrations.tracker_parity_run TRACKER
SIDE ROOT [CASE]` trains the shared tiny run with `report_to=[TRACKER]` (SIDE "reference": transformers.Trainer,
"ours": hf_lightning's Trainer), the tracker in its offline / local mode, then reads back what the tracker stored with
its own reader and writes `ROOT/record.json`: the metrics' (step, value) series, the config, the run name, the step
metric, the files written (under the run's working directory, output_dir and home), the files holding the run's
`hub_token` and every attempt to reach a host other than this one (the guard refuses them). CASE, a JSON object,
adds the integration's own environment switches (`env`, set after the offline mode's) and arguments (`settings`).

A process per side: several trackers keep process-wide state (a current run, a store folder read at import).
"""

from __future__ import annotations

import glob
import json
import os
import re
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0", ""}
ATTEMPTS: list[str] = []
RUN_NAME = "parity-run"
# Every run is given a Hub token (no push): no file may hold it (docs/divergences.md, "the token in a tracker's
# model files").
HUB_TOKEN = "hf_parityTrackerSecret0123456789"


def _refuse_network() -> None:
    """Every connection or name lookup for a host other than this one is recorded and refused."""
    real_connect, real_connect_ex, real_getaddrinfo = (
        socket.socket.connect,
        socket.socket.connect_ex,
        socket.getaddrinfo,
    )

    def host_of(address: Any) -> str | None:
        if isinstance(address, tuple) and address:
            return str(address[0])
        return None  # a Unix socket

    def refuse(host: str) -> None:
        where = "".join(traceback.format_stack(limit=8)[:-2])
        ATTEMPTS.append(f"{host}\n{where}")
        raise OSError(101, f"network refused by the parity test: {host}")

    def connect(self: socket.socket, address: Any) -> Any:
        host = host_of(address)
        if host is not None and host not in LOCAL_HOSTS:
            refuse(host)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> Any:
        host = host_of(address)
        if host is not None and host not in LOCAL_HOSTS:
            refuse(host)
        return real_connect_ex(self, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else str(host or "")
        if name not in LOCAL_HOSTS:
            refuse(name)
        return real_getaddrinfo(host, *args, **kwargs)

    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
    socket.getaddrinfo = getaddrinfo  # type: ignore[assignment]


def tracker_environment(tracker: str, root: Path) -> dict[str, str]:
    """The variables that put each tracker in its offline / local mode, its files under `root`."""
    home = root / "home"
    common = {
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "DO_NOT_TRACK": "1",
        "DISABLE_MLFLOW_INTEGRATION": "FALSE",
    }
    per_tracker = {
        "wandb": {
            "WANDB_MODE": "offline",
            "WANDB_SILENT": "true",
            "WANDB_CONSOLE": "off",
            "WANDB_DISABLE_GIT": "true",
            "WANDB_DISABLE_CODE": "true",
            "WANDB_X_DISABLE_STATS": "true",
            "WANDB_PROJECT": "parity",
            "NETRC": str(home / "no-netrc"),
        },
        "mlflow": {"MLFLOW_EXPERIMENT_NAME": "parity", "MLFLOW_DISABLE_TELEMETRY": "true"},
        "trackio": {"TRACKIO_DIR": str(home / "trackio")},
        "swanlab": {"SWANLAB_MODE": "offline", "SWANLAB_LOG_DIR": str(root / "cwd" / "swanlog"), "SWANLAB_PROJECT": "parity"},
        "dvclive": {"DVC_NO_ANALYTICS": "1", "DVCLIVE_TEST": "false"},
        "codecarbon": {"CODECARBON_LOG_LEVEL": "error"},
        "clearml": {"CLEARML_OFFLINE_MODE": "1", "CLEARML_NO_DEFAULT_SERVER": "1", "TRAINS_NO_DEFAULT_SERVER": "1"},
        "dagshub": {
            "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'dagshub' / 'owner' / 'repo.db'}",
            "MLFLOW_DISABLE_TELEMETRY": "true",
        },
    }
    return {**common, **per_tracker.get(tracker, {})}


# ---------------------------------------------------------------- the shared run

SETTINGS = dict(
    use_cpu=True,
    save_strategy="no",
    per_device_train_batch_size=2,
    learning_rate=1e-2,
    max_steps=4,
    logging_steps=1,
    eval_strategy="steps",
    eval_steps=2,
    run_name=RUN_NAME,
    seed=0,
    disable_tqdm=True,
    hub_token=HUB_TOKEN,
)


def train(side: str, tracker: str, root: Path, case_settings: dict[str, Any]) -> Any:
    """The shared run: 4 updates logged at each, evaluations at 2 and 4, then one `evaluate()` after `train()`."""
    import transformers

    from tests.models import make_regression_mlp, regression_data

    settings = {**SETTINGS, **case_settings}
    output_dir = str(root / "out")
    if side == "reference":
        args = transformers.TrainingArguments(output_dir=output_dir, report_to=[tracker], **settings)
        trainer_class = transformers.Trainer
        extra: dict[str, Any] = {}
    else:
        from hf_lightning import Trainer, TrainingArguments

        args = TrainingArguments(output_dir=output_dir, report_to=[tracker], **settings)
        trainer_class = Trainer
        extra = {}  # the telemetry stays on (its default): its perf/ figures must not reach the tracker
    transformers.set_seed(0)
    trainer = trainer_class(
        model=make_regression_mlp(),
        args=args,
        train_dataset=regression_data(8),
        eval_dataset=regression_data(4, seed=1),
        **extra,
    )
    trainer.train()
    trainer.evaluate()
    return trainer


# ---------------------------------------------------------------- what each tracker stored, read back


def _normalise(value: Any, root: Path) -> Any:
    """Paths of this side's root made neutral, so both sides' configs compare."""
    if isinstance(value, str):
        return value.replace(str(root), "<root>")
    if isinstance(value, dict):
        return {str(k): _normalise(v, root) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalise(v, root) for v in value]
    return value


def _in_time_order(events):
    """TensorBoard events by step, then by when they were written: a writer reopened after `train()` (the
    reference's callback closes its writer at train end) adds a second events file, which the reader may load
    first."""
    return sorted(events, key=lambda event: (event.step, event.wall_time))


def read_tensorboard(root: Path) -> dict[str, Any]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = sorted({os.path.dirname(path) for path in glob.glob(str(root / "**" / "events.out.tfevents.*"), recursive=True)})
    assert len(runs) == 1, runs
    accumulator = EventAccumulator(runs[0], size_guidance={"tensors": 0, "scalars": 0})
    accumulator.Reload()
    metrics = {tag: [[e.step, e.value] for e in _in_time_order(accumulator.Scalars(tag))] for tag in accumulator.Tags()["scalars"]}
    config = {}
    for tag in accumulator.Tags()["tensors"]:
        (event,) = accumulator.Tensors(tag)
        config[tag] = event.tensor_proto.string_val[0].decode()
    return {"metrics": metrics, "config": config, "run_name": None, "step_metric": "global_step"}


def _read_mlflow(uri: str) -> dict[str, Any]:
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.flush_async_logging()  # the callback logs asynchronously; DagsHub's on_train_end does not flush

    client = MlflowClient(uri)
    runs = []
    for experiment in client.search_experiments():
        for run in client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"]):
            metrics = {
                key: sorted([m.step, m.value] for m in client.get_metric_history(run.info.run_id, key))
                for key in run.data.metrics
            }
            runs.append(
                {
                    "experiment": experiment.name,
                    "metrics": metrics,
                    "params": run.data.params,
                    "tags": {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.source")},
                    "run_name": run.info.run_name,
                    "status": run.info.status,
                }
            )
    assert runs, f"no MLflow run in {uri}"
    # MLflow's store keeps one row per (key, step, value, timestamp): the same value logged twice within a
    # millisecond (`epoch` at the last step) is one point or two by timing, so points are compared once each.
    merged: dict[str, list] = {}
    for run in runs:
        for key, points in run["metrics"].items():
            merged.setdefault(key, []).extend(points)
    merged = {key: sorted({tuple(point) for point in points}) for key, points in merged.items()}
    return {
        "metrics": merged,
        "config": [{"params": r["params"], "tags": r["tags"], "experiment": r["experiment"]} for r in runs],
        "run_name": [r["run_name"] for r in runs],
        "step_metric": "step",
    }


def read_mlflow(root: Path) -> dict[str, Any]:
    return _read_mlflow(f"sqlite:///{root / 'cwd' / 'mlflow.db'}")


def read_wandb(root: Path) -> dict[str, Any]:
    import wandb

    from tests.integrations.test_logger_backends import _finished_records, _wandb_history_and_summary

    wandb.finish()
    (run_file,) = glob.glob(str(root / "cwd" / "wandb" / "offline-run-*" / "run-*.wandb"))
    run, rows, summary = _wandb_history_and_summary(run_file)
    metrics: dict[str, list] = {}
    for row in rows:
        for key, value in row.items():
            if not key.startswith("_") and isinstance(value, (int, float)):
                metrics.setdefault(key, []).append([row.get("train/global_step", row.get("_step")), value])
    config = {}
    step_metrics = []
    for record in _finished_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "config":
            for item in record.config.update:
                config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "metric":
            step_metrics.append([record.metric.glob_name or record.metric.name, record.metric.step_metric])
    for item in run.config.update:
        config.setdefault(item.key, json.loads(item.value_json))
    config.pop("_wandb", None)
    summary = {k: v for k, v in summary.items() if not k.startswith("_")}
    return {
        "metrics": metrics,
        "config": {"config": config, "summary_keys": sorted(summary), "project": run.project},
        "run_name": run.display_name,
        "step_metric": step_metrics,
    }


def read_trackio(root: Path) -> dict[str, Any]:
    from trackio.fragments import import_inbox_dir
    from trackio.sqlite_storage import SQLiteStorage

    import_inbox_dir()  # TRACKIO_STORAGE_MODE=jsonl: the fragments into the store, as trackio's dashboard does
    (project,) = SQLiteStorage.get_projects()
    (run,) = SQLiteStorage.get_runs(project)
    logs = SQLiteStorage.get_logs(project, run)
    metrics: dict[str, list] = {}
    for entry in logs:
        for key, value in entry.items():
            if key not in ("step", "timestamp") and isinstance(value, (int, float)):
                metrics.setdefault(key, []).append([entry["step"], value])
    config = SQLiteStorage.get_run_config(project, run) or {}
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    return {"metrics": metrics, "config": {"project": project, "config": config}, "run_name": run, "step_metric": "train/global_step"}


def read_dvclive(root: Path) -> dict[str, Any]:
    import csv

    import yaml

    base = root / "cwd" / "dvclive"
    metrics: dict[str, list] = {}
    for path in sorted(glob.glob(str(base / "plots" / "metrics" / "**" / "*.tsv"), recursive=True)):
        key = os.path.relpath(path, base / "plots" / "metrics")[: -len(".tsv")]
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle, delimiter="\t"):
                metrics.setdefault(key, []).append([int(row["step"]), float(row[os.path.basename(key)])])
    params = yaml.safe_load((base / "params.yaml").read_text())
    summary = json.loads((base / "metrics.json").read_text())
    return {"metrics": metrics, "config": {"params": params, "summary_keys": sorted(summary)}, "run_name": None, "step_metric": "step"}


def read_codecarbon(root: Path) -> dict[str, Any]:
    import csv

    with open(root / "out" / "emissions.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    # Every figure is measured energy or time; what is compared is the columns and the run's identity.
    keep = ("project_name", "country_name", "country_iso_code", "tracking_mode", "os", "python_version")
    return {
        "metrics": {},
        "config": {"columns": sorted(rows[0]), "rows": len(rows), "identity": [{k: r.get(k) for k in keep} for r in rows]},
        "run_name": None,
        "step_metric": None,
    }


def read_swanlab(root: Path) -> dict[str, Any]:
    import swanlab
    import yaml
    from swanlab.data.porter.datastore import DataStore

    swanlab.finish()
    (backup,) = glob.glob(str(root / "cwd" / "swanlog" / "run-*" / "backup.swanlab"))
    store = DataStore()
    store.open_for_scan(backup)
    metrics: dict[str, list] = {}
    names = {}
    for line in store:
        record = json.loads(line)
        kind, data = record["model_type"], record["data"]
        if kind == "Scalar":
            metrics.setdefault(data["key"], []).append([data["step"], data["metric"]["data"]])
        elif kind in ("Project", "Experiment"):
            names[kind] = data["name"]
    (config_file,) = glob.glob(str(root / "cwd" / "swanlog" / "run-*" / "files" / "config.yaml"))
    config = {key: entry["value"] for key, entry in yaml.safe_load(Path(config_file).read_text()).items()}
    return {"metrics": metrics, "config": {"project": names["Project"], "config": config}, "run_name": names["Experiment"], "step_metric": "step"}


def read_clearml(root: Path) -> dict[str, Any]:
    (folder,) = [p for p in glob.glob(str(root / "home" / ".clearml" / "cache" / "offline" / "*")) if os.path.isdir(p)]
    metrics: dict[str, list] = {}
    with open(os.path.join(folder, "metrics.jsonl")) as handle:
        for line in handle:
            for event in json.loads(line):
                if event.get("type") == "training_stats_scalar":
                    key = f"{event['metric']}/{event['variant']}"
                    metrics.setdefault(key, []).append([event["iter"], event["value"]])
    task = json.loads(Path(folder, "task.json").read_text())
    hyperparams = {
        section: {name: item.get("value") for name, item in values.items()}
        for section, values in (task.get("hyperparams") or {}).items()
    }
    configuration = {name: item.get("value") for name, item in (task.get("configuration") or {}).items()}
    return {
        "metrics": metrics,
        "config": {"hyperparams": hyperparams, "configuration": configuration, "project": task.get("project_name")},
        "run_name": task.get("name"),
        "step_metric": "iter",
    }


# What a boundary fake recorded (azure_ml, dagshub, flyte), read back as the tracker's calls.
CALLS: list[list[Any]] = []


def read_azure_ml(root: Path) -> dict[str, Any]:
    metrics: dict[str, list] = {}
    for name, value, description in CALLS:
        assert description == name
        metrics.setdefault(name, []).append([len(metrics.get(name, [])), value])
    return {"metrics": metrics, "config": {}, "run_name": None, "step_metric": "call order"}


def read_dagshub(root: Path) -> dict[str, Any]:
    record = _read_mlflow(f"sqlite:///{root / 'dagshub' / 'owner' / 'repo.db'}")
    record["config"] = {"mlflow": record["config"], "repo": CALLS}
    return record


def read_flyte(root: Path) -> dict[str, Any]:
    return {"metrics": {}, "config": {"checkpoints_synced": CALLS}, "run_name": None, "step_metric": None}


def replace_boundaries(tracker: str) -> None:
    """Where the reference's own callback contacts a service even in the tracker's offline mode, that one call is
    replaced (the same on both sides); every other connection is still refused by the guard."""
    if tracker == "clearml":
        # Task.init asks updates.clear.ml for a newer release, offline mode or not.
        from clearml.utilities.check_updates import CheckPackageUpdates

        CheckPackageUpdates.check_new_package_available = classmethod(lambda cls, only_once=False: None)
    elif tracker == "codecarbon":
        # EmissionsTracker looks the machine up by IP (get.geojs.io, ipinfo.io) and asks cloud metadata services.
        from codecarbon.emissions_tracker import EmissionsTracker
        from codecarbon.external.geography import CloudMetadata, GeoMetadata

        EmissionsTracker._get_geo_metadata = lambda self: GeoMetadata(country_iso_code="FRA", country_name="France")
        EmissionsTracker._get_cloud_metadata = lambda self: CloudMetadata(provider=None, region=None)
    elif tracker == "azure_ml":
        # Run.get_context(): the run of the Azure ML job this process belongs to.
        from azureml.core.run import Run

        class RecordingRun:
            def log(self, name: str, value: Any, description: str = "") -> None:
                CALLS.append([name, value, description])

        Run.get_context = staticmethod(lambda *args, **kwargs: RecordingRun())
    elif tracker == "dagshub":
        # dagshub.upload.Repo: the DagsHub repository the artefacts go to (its constructor asks dagshub.com).
        import dagshub.upload

        class RecordingRepo:
            def __init__(self, owner: str, name: str, branch: str = "main") -> None:
                CALLS.append(["Repo", owner, name, branch])

            def directory(self, path: str) -> Any:
                CALLS.append(["directory", path])
                return self

            def add_dir(self, path: str) -> None:
                CALLS.append(["add_dir", path])

        dagshub.upload.Repo = RecordingRepo
    elif tracker == "flyte":
        # current_context().checkpoint: the Flyte task's checkpoint store (outside a Flyte task there is none).
        import flytekit

        class RecordingCheckpoint:
            def save(self, path: str) -> None:
                CALLS.append([os.path.basename(path), sorted(os.listdir(path))])

        class Context:
            checkpoint = RecordingCheckpoint()

        flytekit.current_context = lambda: Context()


READERS = {
    "tensorboard": read_tensorboard,
    "mlflow": read_mlflow,
    "wandb": read_wandb,
    "trackio": read_trackio,
    "dvclive": read_dvclive,
    "codecarbon": read_codecarbon,
    "dagshub": read_dagshub,
    "swanlab": read_swanlab,
    "clearml": read_clearml,
    "azure_ml": read_azure_ml,
    "flyte": read_flyte,
}


def _neutral(part: str) -> str:
    if re.fullmatch(r"tmp\w{8}", part):  # tempfile's random names (wandb's artefact staging)
        return "<var>"
    if not re.search(r"\d", part):
        return part
    extension = os.path.splitext(part)[1]
    return "<var>" + ("" if re.search(r"\d", extension) else extension)


def files_written(root: Path) -> list[str]:
    """Every file under the side's root, each path part that carries a time, an id or a host name made neutral."""
    found = set()
    for folder, _, names in os.walk(root):  # hidden folders too (~/.clearml, ~/.config, ...)
        for name in names:
            parts = os.path.relpath(os.path.join(folder, name), root).split(os.sep)
            if parts != ["record.json"]:
                found.add("/".join(_neutral(part) for part in parts))
    return sorted(found)


def files_holding_the_token(root: Path) -> list[str]:
    """Every file under the side's root whose bytes hold the run's `hub_token`."""
    token = HUB_TOKEN.encode()
    holding = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as handle:
                if token in handle.read():
                    holding.append(os.path.relpath(path, root))
    return sorted(holding)


def main(tracker: str, side: str, root: Path, case: dict[str, Any]) -> None:
    for name, value in {**tracker_environment(tracker, root), **case.get("env", {})}.items():
        os.environ[name] = value
    for folder in ("cwd", "out", "home"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    if tracker == "clearml":
        # ClearML's reporter as a thread, not a forked process: forked from a process with threads running, it
        # deadlocked now and then under the test's load (on either side).
        (root / "home" / "clearml.conf").write_text("sdk { development { report_use_subprocess: false } }\n")
    os.chdir(root / "cwd")
    _refuse_network()
    replace_boundaries(tracker)
    record: dict[str, Any] = {}
    try:
        trainer = train(side, tracker, root, case.get("settings", {}))
        record.update(_normalise(READERS[tracker](root), root))
        record["log_history"] = trainer.state.log_history
    except Exception:
        record["error"] = traceback.format_exc()
    record["network_attempts"] = ATTEMPTS
    record["files"] = files_written(root)
    record["token_files"] = files_holding_the_token(root)
    (root / "record.json").write_text(json.dumps(record, default=str))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), json.loads(sys.argv[4]) if len(sys.argv) > 4 else {})
