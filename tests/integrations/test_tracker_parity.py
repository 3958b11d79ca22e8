"""Every `report_to` integration records what the reference records: transformers.Trainer and ours run the same tiny
model, data and seed with one tracker in its offline / local mode, each side in its own process
(`tracker_parity_run.py`), and what the tracker stored is read back with its own reader and compared: the metric keys,
each key's (step, value) series (runtime and per-second keys by step only), the config, the run name, the step
metric, the files written (nothing outside the places the reference writes) and no attempt to reach another host
(the processes refuse every connection that is not local, and the test fails if one was tried).

Where the reference's own callback contacts a service even in the tracker's offline mode, that one call is replaced
on both sides (`replace_boundaries`): clearml's update check, codecarbon's location and cloud look-ups, Azure ML's
job run, DagsHub's repository, Flyte's checkpoint store; the README lists them.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Checkpoints at steps 2 and 4, for the switches that act on saves.
SAVE_TWICE = {"save_strategy": "steps", "save_steps": 2}
# Every integration the reference runs on this machine (comet_ml: see test_comet_ml_is_not_installed_with_the_rest),
# case name -> (report_to name, the integration's own environment switches, arguments of the case). Every run is
# given a `hub_token` (tracker_parity_run.HUB_TOKEN).
CASES: dict[str, tuple[str, dict[str, str], dict]] = {
    "tensorboard": ("tensorboard", {}, {}),
    "mlflow": ("mlflow", {}, {}),
    # Each checkpoint logged as an MLflow model, its folder copied into the run's artefacts.
    "mlflow-log-artifacts": ("mlflow", {"HF_MLFLOW_LOG_ARTIFACTS": "true", "MLFLOW_TAGS": '{"case": "artifacts"}'}, SAVE_TWICE),
    "wandb": ("wandb", {}, {}),
    # The model logged at the end as an artefact (saved through a transformers.Trainer built on the arguments).
    "wandb-log-model": ("wandb", {"WANDB_LOG_MODEL": "end"}, {}),
    "trackio": ("trackio", {}, {}),
    # Trackio's append-only store and the `project` argument.
    "trackio-switches": ("trackio", {"TRACKIO_STORAGE_MODE": "jsonl"}, {"project": "parity-project"}),
    "swanlab": ("swanlab", {}, {}),
    # The callback's project switch and its model switch (which the reference's callback only warns about).
    "swanlab-switches": ("swanlab", {"SWANLAB_PROJECT": "parity-switches", "SWANLAB_LOG_MODEL": "end"}, {}),
    "dvclive": ("dvclive", {}, {}),
    # The model logged at the end (the callback saves it through a transformers.Trainer built on our arguments).
    "dvclive-log-model": ("dvclive", {"HF_DVCLIVE_LOG_MODEL": "true"}, {}),
    "codecarbon": ("codecarbon", {}, {}),
    # codecarbon's own configuration switch: the project name in the emissions file.
    "codecarbon-switches": ("codecarbon", {"CODECARBON_PROJECT_NAME": "parity-carbon"}, {}),
    "clearml": ("clearml", {}, {}),
    # The task's project and name (CLEARML_LOG_MODEL's checkpoint upload fails offline in the reference itself).
    "clearml-switches": ("clearml", {"CLEARML_PROJECT": "parity-project", "CLEARML_TASK": "parity-task"}, {}),
    "azure_ml": ("azure_ml", {}, {}),
    "dagshub": ("dagshub", {}, {}),
    # The callback syncs checkpoints: save twice.
    "flyte": ("flyte", {}, SAVE_TWICE),
}
# The cases where the reference writes the run's token to disk (its callback pickles the arguments).
REFERENCE_WRITES_THE_TOKEN = ("wandb-log-model", "dvclive-log-model")
# Keys whose values are wall-clock measurements: compared by their steps only.
TIMED = ("runtime", "per_second", "flos_per_second")
# The tracker's own system monitor (not fed by the trainer): its keys are left out.
OWN_MONITOR_PREFIXES = ("__swanlab__.",)
# Caches libraries keep of this machine (matplotlib's font list, built when ClearML's matplotlib binding imports
# pyplot in a process that had loaded matplotlib).
LIBRARY_CACHES = ("home/.cache/matplotlib/",)
# The checkpoint marker every checkpoint of ours holds (docs/divergences.md, "Atomic checkpoint writes").
MARKER = "hf_lightning_complete.json"


def _run_side(case: str, side: str, root: Path) -> dict:
    tracker, switches, settings = CASES[case]
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.integrations.tracker_parity_run",
            tracker,
            side,
            str(root),
            json.dumps({"env": switches, "settings": settings}),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=400,
    )
    record_file = root / "record.json"
    assert record_file.is_file(), f"{case}/{side} wrote no record:\n{completed.stdout[-3000:]}{completed.stderr[-3000:]}"
    return json.loads(record_file.read_text())


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """case -> {"reference": record, "ours": record}: every side's process, run a few at a time."""
    base = tmp_path_factory.mktemp("trackers")
    jobs = [(case, side) for case in CASES for side in ("reference", "ours")]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2))) as pool:
        futures = {job: pool.submit(_run_side, job[0], job[1], base / job[0] / job[1]) for job in jobs}
        results: dict[str, dict] = {}
        for (tracker, side), future in futures.items():
            results.setdefault(tracker, {})[side] = future.result()
    return results


def _timed(key: str) -> bool:
    return any(word in key for word in TIMED)


def _metrics(record: dict) -> dict[str, list]:
    return {
        key: sorted(points, key=lambda point: point[0])
        for key, points in record["metrics"].items()
        if not key.startswith(OWN_MONITOR_PREFIXES)
    }


def _assert_same_series(ours: dict[str, list], reference: dict[str, list]) -> None:
    assert sorted(ours) == sorted(reference)
    for key, points in reference.items():
        steps = [point[0] for point in points]
        assert [point[0] for point in ours[key]] == steps, key
        if not _timed(key):
            assert [point[1] for point in ours[key]] == pytest.approx([p[1] for p in points], rel=1e-6), key


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_the_tracker_records_what_the_reference_records(records, case):
    reference, ours = records[case]["reference"], records[case]["ours"]
    assert "error" not in reference, reference["error"]
    assert "error" not in ours, ours["error"]
    # Nothing tried to reach another host, on either side.
    assert reference["network_attempts"] == [] and ours["network_attempts"] == []
    # The same training on both sides, so the tracker was fed the same entries.
    assert len(ours["log_history"]) == len(reference["log_history"])

    _assert_same_series(_metrics(ours), _metrics(reference))
    assert not any(key.startswith("perf/") or "/perf/" in key for key in ours["metrics"])  # no telemetry leak
    if CASES[case][0] == "flyte":
        # The synced checkpoints are the reference's, each with the marker our checkpoints carry besides.
        synced = [[name, [f for f in files if f != MARKER]] for name, files in ours["config"]["checkpoints_synced"]]
        assert synced == reference["config"]["checkpoints_synced"]
        assert all(MARKER in files for _, files in ours["config"]["checkpoints_synced"])
    else:
        assert ours["config"] == reference["config"]
    assert ours["run_name"] == reference["run_name"]
    assert ours["step_metric"] == reference["step_metric"]
    # Nothing written outside the places the reference writes (the checkpoint marker aside; a library's own cache
    # of this machine's fonts is not a record of the run).
    # wandb's service process writes the run's `.wandb` log after the training process ends, so whether it exists
    # when the folder is listed is a race on either side: in the reference's run folder, it is in place.
    def in_a_reference_run_folder(path: str) -> bool:
        folder = os.path.dirname(path) + "/"
        return any(other.startswith(folder) for other in reference["files"])

    outside = [
        path
        for path in ours["files"]
        if path not in reference["files"] and not path.endswith(MARKER) and not path.startswith(LIBRARY_CACHES)
        and not (path.endswith(".wandb") and in_a_reference_run_folder(path))
    ]
    assert outside == []


@pytest.mark.slow
def test_the_parity_records_are_not_empty(records):
    """The comparison can fail: each tracker stored something of the run, and the metric-fed ones its losses."""
    for case, sides in records.items():
        reference = sides["reference"]
        assert reference["files"] or case == "azure_ml", case
        if CASES[case][0] not in ("codecarbon", "flyte"):
            assert any("loss" in key for key in reference["metrics"]), case
    # Each switch acted, on both sides.
    for side in ("reference", "ours"):
        record = {case: sides[side] for case, sides in records.items()}
        assert "out/last/model.safetensors" in record["dvclive-log-model"]["files"]
        logged = [path for path in record["mlflow-log-artifacts"]["files"] if "/artifacts/artifacts/" in path]
        assert any(path.endswith("/model.safetensors") for path in logged)  # the checkpoints, as MLflow models
        assert {"case": "artifacts"}.items() <= record["mlflow-log-artifacts"]["config"][0]["tags"].items()
        assert any("wandb/artifacts/staging/" in path for path in record["wandb-log-model"]["files"])
        assert not any("wandb/artifacts/" in path for path in record["wandb"]["files"])
        assert record["trackio-switches"]["config"]["project"] == "parity-project"
        assert record["swanlab-switches"]["config"]["project"] == "parity-switches"
        assert record["codecarbon-switches"]["config"]["identity"][0]["project_name"] == "parity-carbon"
        assert record["clearml-switches"]["config"]["project"] == "parity-project"
        assert record["clearml-switches"]["run_name"] == "parity-task"


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_the_token_reaches_no_file(records, case):
    """Every run is given a `hub_token`: no file of ours holds it. The reference writes it where its callback
    pickles the arguments (the model switches of W&B and DVCLive), and in every checkpoint it saves."""
    assert records[case]["ours"]["token_files"] == []
    reference = records[case]["reference"]["token_files"]
    if case in REFERENCE_WRITES_THE_TOKEN:
        assert not all(path.startswith("out/checkpoint-") for path in reference), reference
    if CASES[case][2].get("save_strategy") == "steps":
        assert "out/checkpoint-2/training_args.bin" in reference


def test_comet_ml_is_not_installed_with_the_rest():
    """comet_ml is left out of the dev extra: transformers imports it whenever it is installed, and the import
    patches mlflow and torch, writes ./.cometml-runs and sends error reports to sentry.io, which changes the other
    trackers' runs. Its name is carried by the reference's CometCallback like the others (the carrier test)."""
    if importlib.util.find_spec("comet_ml") is not None:
        pytest.skip("comet_ml is installed here: its parity run is not part of this suite (reason above)")
    from hf_lightning.translation.environment import Environment
    from hf_lightning.translation.logger_specs import reference_integrations, requested_loggers

    carried = Environment(installed_loggers=frozenset({"comet_ml"}), reference_integrations=True)
    assert reference_integrations(["comet_ml"], carried) == ["comet_ml"]
    message = str(pytest.raises(ValueError, requested_loggers, ["comet_ml"], Environment(reference_integrations=True)).value)
    assert "pip install comet-ml" in message
