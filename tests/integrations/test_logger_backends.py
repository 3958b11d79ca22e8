"""report_to backends, end to end: a short real run, then what each backend wrote is read back and
compared with `state.log_history` under the reference's per-integration key conventions
(transformers' `rewrite_logs` for TensorBoard, CSV and W&B; unprefixed keys for MLflow)."""

from __future__ import annotations

import csv
import glob
import json
import os
import struct
import time
from collections import defaultdict

import numpy as np
import pytest
from transformers.integrations.integration_utils import (
    INTEGRATION_TO_CALLBACK,
    get_available_reporting_integrations,
)
from transformers.integrations.integration_utils import rewrite_logs as reference_rewrite_logs

from hf_lightning import TrainingArguments
from hf_lightning.integrations.logger_backends.wandb import resolve_wandb_mode, wandb_credentials_configured
from hf_lightning.integrations.loggers import build_loggers
from hf_lightning.trainer.trainer import HFLightningTrainer
from hf_lightning.translation.environment import Environment
from hf_lightning.translation.logger_specs import (
    CALLBACK_INTEGRATIONS,
    LOGGER_PACKAGES,
    SUPPORTED_LOGGERS,
    default_mlflow_tracking_uri,
    logger_specs,
    reference_integrations,
    requested_loggers,
)
from hf_lightning.translation.translate import translate
from tests.models import make_regression_mlp, regression_data

SECRET = "secret-token-123"
SUMMARY_ONLY = (
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
    "train_loss",
    "total_flos",
)


def _train(tmp_path, report_to, compute_metrics=None, telemetry=False, **kwargs):
    """4 updates, a log at each, evaluations at steps 2 and 4, then one more evaluation after `train()`."""
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=False,  # the printer would pop total_flos before the loggers see it (reported)
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        max_steps=4,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=2,
        report_to=report_to,
        run_name="backend-run",
        hub_token=SECRET,
        **kwargs,
    )
    trainer = HFLightningTrainer(
        model=make_regression_mlp(),
        args=args,
        train_dataset=regression_data(8),
        eval_dataset=regression_data(4, seed=1),
        compute_metrics=compute_metrics,
        # These tests hold each backend to the reference's keys and rows; the telemetry's perf/ figures, which
        # go to the same loggers, are checked in `test_the_telemetry_figures_reach_the_backends_under_perf`.
        telemetry=telemetry,
    )
    trainer.train()
    trainer.evaluate()  # logged after fit: the loggers must still receive it
    return trainer


def _numbers(entry):
    return {key: value for key, value in entry.items() if key != "step" and isinstance(value, (int, float))}


def _in_time_order(events):
    """TensorBoard events by step, then by when they were written: a writer reopened after `train()` (the
    reference's callback closes its writer at train end) adds a second events file, which the reader may load
    first."""
    return sorted(events, key=lambda event: (event.step, event.wall_time))


def _expected_series(history, rewrite):
    """key -> [(step, value), ...] in logging order, as the reference's integration would write them."""
    series = defaultdict(list)
    for entry in history:
        for key, value in rewrite(_numbers(entry)).items():
            series[key].append((entry["step"], value))
    return dict(series)


def _assert_series_equal(actual, expected, rel=0.0):
    assert sorted(actual) == sorted(expected)
    for key, points in expected.items():
        assert [step for step, _ in actual[key]] == [step for step, _ in points], key
        assert [value for _, value in actual[key]] == pytest.approx(
            [value for _, value in points], rel=rel
        ), key


def _assert_no_secret(root):
    leaks = [
        path for path in glob.glob(os.path.join(root, "**", "*"), recursive=True) if os.path.isfile(path)
    ]
    leaks = [path for path in leaks if SECRET.encode() in open(path, "rb").read()]
    assert leaks == []


def test_history_has_train_eval_and_post_fit_entries(tmp_path):
    """The shape the backend tests rely on: the same step carries train, eval and summary entries."""
    history = _train(tmp_path, "none").state.log_history
    assert [(entry["step"], next(iter(entry))) for entry in history] == [
        (1, "loss"),
        (2, "loss"),
        (2, "eval_loss"),
        (3, "loss"),
        (4, "loss"),
        (4, "eval_loss"),
        (4, "train_runtime"),
        (4, "eval_loss"),
    ]


# ------------------------------------------------------------------ tensorboard and csv


def test_tensorboard_and_csv_hold_the_log_history(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = _train(tmp_path, ["tensorboard", "csv"])
    expected = _expected_series(trainer.state.log_history, reference_rewrite_logs)
    assert "train/total_flos" in expected and "eval/loss" in expected and "train/train_loss" in expected

    (run_dir,) = glob.glob(str(tmp_path / "out" / "runs" / "*"))
    accumulator = EventAccumulator(run_dir)
    accumulator.Reload()
    scalars = {
        tag: [(e.step, e.value) for e in _in_time_order(accumulator.Scalars(tag))] for tag in accumulator.Tags()["scalars"]
    }
    _assert_series_equal(scalars, expected, rel=1e-6)  # TensorBoard stores float32

    (metrics_file,) = glob.glob(str(tmp_path / "out" / "lightning_logs" / "*" / "metrics.csv"))
    with open(metrics_file, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(trainer.state.log_history)  # one row per log() call
    from_csv = defaultdict(list)
    for row in rows:
        for key, value in row.items():
            if key != "step" and value != "":
                from_csv[key].append((int(row["step"]), float(value)))
    _assert_series_equal(dict(from_csv), expected)  # CSV keeps full precision
    _assert_no_secret(str(tmp_path / "out"))


def test_the_telemetry_figures_reach_the_lightning_loggers_under_perf(tmp_path, monkeypatch):
    """With the telemetry on (the default), each logging window's figures and each evaluation's reach our Lightning
    loggers (TensorBoard and CSV here, `HF_LIGHTNING_REPORT_THROUGH=lightning`) as `perf/<name>` at their step,
    beside the reference's keys, which are unchanged."""
    monkeypatch.setenv("HF_LIGHTNING_REPORT_THROUGH", "lightning")
    trainer = _train(tmp_path, ["tensorboard", "csv"], telemetry=True)
    expected = _expected_series(trainer.state.log_history, reference_rewrite_logs)
    for series in _tensorboard_and_csv_series(tmp_path / "out"):
        perf = {key: value for key, value in series.items() if key.startswith("perf/")}
        assert [step for step, _ in perf["perf/samples_per_second"]] == [1, 2, 3, 4]
        assert [step for step, _ in perf["perf/data_wait_share"]] == [1, 2, 3, 4]
        assert [step for step, _ in perf["perf/eval_samples_per_second"]] == [2, 4, 4]
        assert all(value > 0 for _, value in perf["perf/samples_per_second"])
        reference_keys = {key: value for key, value in series.items() if not key.startswith("perf/")}
        assert set(reference_keys) == set(expected)


def test_the_telemetry_figures_stay_out_of_the_reference_integrations_unless_asked(tmp_path):
    """The reference's TensorBoardCallback (the default carrier) is fed from `on_log` only: the telemetry's perf/
    figures stay out of it while the CSV logger beside it gets them; with `Telemetry(log_history=True)` they join
    the log entries, so the callback records them as it records any entry (`train/perf/...`)."""
    from hf_lightning import Telemetry

    trainer = _train(tmp_path / "default", ["tensorboard", "csv"], telemetry=True)
    expected = _expected_series(trainer.state.log_history, reference_rewrite_logs)
    scalars, from_csv = _tensorboard_and_csv_series(tmp_path / "default" / "out")
    assert set(scalars) == set(expected)  # no perf/ key
    assert "perf/samples_per_second" in from_csv

    trainer = _train(tmp_path / "asked", ["tensorboard"], telemetry=Telemetry(log_history=True))
    (run_dir,) = glob.glob(str(tmp_path / "asked" / "out" / "runs" / "*"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(run_dir)
    accumulator.Reload()
    steps = [event.step for event in accumulator.Scalars("train/perf/samples_per_second")]
    assert steps == [1, 2, 3, 4]


def _tensorboard_and_csv_series(out_dir):
    """key -> [(step, value), ...] as TensorBoard and the CSV logger hold them under `out_dir`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run_dir,) = glob.glob(str(out_dir / "runs" / "*"))
    accumulator = EventAccumulator(run_dir)
    accumulator.Reload()
    scalars = {
        tag: [(e.step, e.value) for e in _in_time_order(accumulator.Scalars(tag))] for tag in accumulator.Tags()["scalars"]
    }
    (metrics_file,) = glob.glob(str(out_dir / "lightning_logs" / "*" / "metrics.csv"))
    from_csv = defaultdict(list)
    with open(metrics_file, newline="") as handle:
        for row in csv.DictReader(handle):
            for key, value in row.items():
                if key != "step" and value != "":
                    from_csv[key].append((int(row["step"]), float(value)))
    return scalars, dict(from_csv)


def _numpy_mse_mae(eval_prediction):
    errors = eval_prediction.predictions - eval_prediction.label_ids
    return {"mse": float((errors**2).mean()), "mae": float(np.abs(errors).mean())}


def _untimed(mapping):
    """Without the wall-clock keys (`*_runtime`, `*_per_second`, `*_model_preparation_time`): two runs differ."""
    return {
        key: value
        for key, value in mapping.items()
        if not any(word in key for word in ("runtime", "per_second", "preparation"))
    }


def test_metric_object_values_reach_the_loggers_as_a_numpy_compute_metrics_does(tmp_path):
    """A torchmetrics compute_metrics and a numpy one computing the same metrics, on the same run: the same
    log_history keys (eval_ prefix, a metric_key_prefix of evaluate()) and values, so TensorBoard and the CSV
    logger hold the same series under the same names."""
    from torchmetrics.regression import MeanAbsoluteError, MeanSquaredError

    runs = {}
    for side, compute_metrics in (
        ("numpy", _numpy_mse_mae),
        ("object", {"mse": MeanSquaredError(), "mae": MeanAbsoluteError()}),
    ):
        trainer = _train(tmp_path / side, ["tensorboard", "csv"], compute_metrics=compute_metrics)
        trainer.evaluate(metric_key_prefix="holdout")
        history = trainer.state.log_history
        scalars, from_csv = _tensorboard_and_csv_series(tmp_path / side / "out")
        expected = _expected_series(history, reference_rewrite_logs)
        _assert_series_equal(scalars, expected, rel=1e-6)  # TensorBoard stores float32
        _assert_series_equal(from_csv, expected)
        runs[side] = history, from_csv

    (numpy_history, numpy_csv), (object_history, object_csv) = runs["numpy"], runs["object"]
    # Four evaluations each: steps 2 and 4 during train(), then evaluate() and evaluate(metric_key_prefix=...).
    evaluations = [entry for entry in object_history if "eval_mse" in entry or "holdout_mse" in entry]
    assert len(evaluations) == 4 and evaluations[-1]["holdout_mse"] > 0
    assert [list(entry) for entry in object_history] == [list(entry) for entry in numpy_history]
    for ours, theirs in zip(object_history, numpy_history):
        assert _untimed(ours) == pytest.approx(_untimed(theirs), rel=1e-6)
    assert sorted(object_csv) == sorted(numpy_csv)
    assert {"eval/mse", "eval/mae", "train/holdout_mse", "train/holdout_mae"} <= set(object_csv)
    for key, points in _untimed(numpy_csv).items():
        assert [step for step, _ in object_csv[key]] == [step for step, _ in points], key
        assert [value for _, value in object_csv[key]] == pytest.approx([v for _, v in points], rel=1e-6), key


# Two logged optimizer steps on CPU, nothing saved: the run both before-train logging tests make.
TWO_LOGGED_STEPS = dict(
    use_cpu=True,
    save_strategy="no",
    disable_tqdm=True,
    per_device_train_batch_size=2,
    max_steps=2,
    logging_steps=1,
)


def test_evaluate_before_train_reaches_the_same_runs_as_training(tmp_path, monkeypatch):
    """The reference's integrations start at their first event: an evaluate() before train() is logged at step 0,
    and train() then writes to the same TensorBoard run and CSV file. The reference's TensorBoard run then lands in
    the working directory, and so does ours when its own callback carries it (the default); our Lightning
    TensorBoard logger (`HF_LIGHTNING_REPORT_THROUGH=lightning`) keeps it under output_dir: docs/divergences.md."""
    import transformers
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    settings = TWO_LOGGED_STEPS
    reference = transformers.Trainer(
        model=make_regression_mlp(),
        args=transformers.TrainingArguments(
            output_dir=str(tmp_path / "reference"), report_to=["tensorboard"], **settings
        ),
        train_dataset=regression_data(8),
        eval_dataset=regression_data(4),
    )
    reference.evaluate()
    reference.train()
    assert glob.glob(str(tmp_path / "cwd" / "runs" / "*"))  # the reference's run, in the working directory
    assert not glob.glob(str(tmp_path / "reference" / "runs" / "*"))

    # The reference's own callback, run by ours: the same place, one run.
    (tmp_path / "cwd-ours").mkdir()
    monkeypatch.chdir(tmp_path / "cwd-ours")
    args = TrainingArguments(output_dir=str(tmp_path / "carried"), report_to=["tensorboard"], **settings)
    trainer = HFLightningTrainer(
        model=make_regression_mlp(),
        args=args,
        train_dataset=regression_data(8),
        eval_dataset=regression_data(4),
        telemetry=False,
    )
    trainer.evaluate()
    trainer.train()
    assert len(glob.glob(str(tmp_path / "cwd-ours" / "runs" / "*"))) == 1
    assert not glob.glob(str(tmp_path / "carried" / "runs" / "*"))

    monkeypatch.setenv("HF_LIGHTNING_REPORT_THROUGH", "lightning")
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=["tensorboard", "csv"], **settings)
    trainer = HFLightningTrainer(
        model=make_regression_mlp(),
        args=args,
        train_dataset=regression_data(8),
        eval_dataset=regression_data(4),
        telemetry=False,  # the reference's rows only (the perf/ ones: the test after `_train`'s users)
    )
    before = trainer.evaluate()
    trainer.train()

    (run_dir,) = glob.glob(str(tmp_path / "out" / "runs" / "*"))  # one run, not one per phase
    accumulator = EventAccumulator(run_dir)
    accumulator.Reload()
    assert [(e.step, e.value) for e in accumulator.Scalars("eval/loss")] == [
        (0, pytest.approx(before["eval_loss"], rel=1e-6))
    ]
    assert [e.step for e in accumulator.Scalars("train/loss")] == [1, 2]
    (metrics_file,) = glob.glob(str(tmp_path / "out" / "lightning_logs" / "*" / "metrics.csv"))
    with open(metrics_file, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 1 + len(trainer.state.log_history)  # train() starts a new state, as the reference's
    assert rows[0]["step"] == "0" and float(rows[0]["eval/loss"]) == pytest.approx(before["eval_loss"])


@pytest.mark.parametrize("override", ["none", "own-logger"])
def test_a_logger_override_also_receives_the_logs_from_before_train(tmp_path, override):
    """`lightning_trainer_overrides["logger"]` replaces the report_to loggers for the whole run: an evaluate()
    before train() goes to the user's logger (or nowhere for `False`), never to a report_to logger."""
    from lightning.pytorch.loggers import CSVLogger

    mine = CSVLogger(save_dir=str(tmp_path / "mine"), name="", version="")
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=["csv"], **TWO_LOGGED_STEPS)
    trainer = HFLightningTrainer(
        model=make_regression_mlp(),
        args=args,
        train_dataset=regression_data(8),
        eval_dataset=regression_data(4),
        telemetry=False,  # the reference's rows only
    )
    trainer.lightning_trainer_overrides = {"logger": False if override == "none" else mine}
    trainer.evaluate()
    trainer.train()

    assert not glob.glob(str(tmp_path / "out" / "lightning_logs" / "**" / "metrics.csv"), recursive=True)
    if override == "none":
        assert trainer.lightning_trainer.loggers == []
        assert not (tmp_path / "mine").exists()
    else:
        assert trainer.lightning_trainer.loggers == [mine]
        with open(tmp_path / "mine" / "metrics.csv", newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert len(rows) == 1 + len(trainer.state.log_history)
        assert rows[0]["step"] == "0" and rows[0]["eval/loss"] != ""


def test_tensorboard_writes_strings_as_text(tmp_path):
    """The reference's TensorBoardCallback: numbers as scalars, strings as text, both key-rewritten."""
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hf_lightning.integrations.logger_backends import backend_for

    tensorboard = TensorBoardLogger(save_dir=str(tmp_path), name="", version="")
    backend_for(tensorboard).send_logs(tensorboard, {"loss": 0.5, "eval_note": "fine", "flag": True}, step=3)
    tensorboard.finalize("success")
    accumulator = EventAccumulator(str(tmp_path))
    accumulator.Reload()
    scalars = {
        tag: [(e.step, e.value) for e in _in_time_order(accumulator.Scalars(tag))] for tag in accumulator.Tags()["scalars"]
    }
    assert scalars == {
        "train/loss": [(3, 0.5)],
        "train/flag": [(3, 1.0)],
    }  # a bool is an int to the reference
    (text,) = accumulator.Tensors("eval/note/text_summary")
    assert text.step == 3 and text.tensor_proto.string_val == [b"fine"]


def test_tensorboard_gets_the_arguments_and_model_config_as_text(tmp_path):
    """The reference's TensorBoardCallback writes `args` (tokens redacted) and `model_config` at train begin:
    the same texts from both trainers on the same model and arguments."""
    import transformers
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import BertConfig, BertForSequenceClassification

    from tests.models import classification_data

    def texts(side: str, trainer_class: type, args_class: type) -> dict[str, dict]:
        config = BertConfig(
            vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
        )
        args = args_class(
            output_dir=str(tmp_path / side),
            use_cpu=True,
            max_steps=1,
            save_strategy="no",
            report_to=["tensorboard"],
            disable_tqdm=True,
            hub_token=SECRET,
        )
        model = BertForSequenceClassification(config)
        trainer_class(model=model, args=args, train_dataset=classification_data(4)).train()
        (run_dir,) = glob.glob(str(tmp_path / side / "runs" / "*"))
        accumulator = EventAccumulator(run_dir)
        accumulator.Reload()
        found = {}
        for tag in ("args", "model_config"):
            (event,) = accumulator.Tensors(f"{tag}/text_summary")
            found[tag] = json.loads(event.tensor_proto.string_val[0].decode())
        return found

    ours = texts("ours", HFLightningTrainer, TrainingArguments)
    reference = texts("reference", transformers.Trainer, transformers.TrainingArguments)
    assert ours["model_config"] == reference["model_config"]
    assert ours["args"]["hub_token"] == reference["args"]["hub_token"] == "<HUB_TOKEN>"
    assert set(ours["args"]) == set(reference["args"])
    differing = {key for key in reference["args"] if ours["args"][key] != reference["args"][key]}
    assert differing == {"output_dir"}  # each side wrote under its own folder
    _assert_no_secret(str(tmp_path / "ours"))


def test_logging_dir_moves_tensorboard_and_csv(tmp_path):
    env = Environment(installed_loggers=frozenset({"tensorboard"}))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=["tensorboard", "csv"])
    args.logging_dir = str(tmp_path / "logs")  # the v4 field, kept as an attribute
    tensorboard, csv_logger = build_loggers(translate(args, env))
    assert os.path.normpath(tensorboard.log_dir) == str(tmp_path / "logs")
    assert csv_logger.log_dir.startswith(str(tmp_path / "logs"))


# ------------------------------------------------------------------ mlflow


def _mlflow_series(client, run_id, keys):
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) for key in keys}


def test_mlflow_file_store_holds_the_log_history(tmp_path, monkeypatch):
    """Our Lightning MLflow logger (the reference's own callback: tests/integrations/test_tracker_parity.py)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("HF_LIGHTNING_REPORT_THROUGH", "lightning")

    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses the file store otherwise
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "hf-lightning-test")
    monkeypatch.setenv("MLFLOW_TAGS", '{"team": "lightning"}')
    trainer = _train(tmp_path, "mlflow")

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("hf-lightning-test")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.tags["mlflow.runName"] == "backend-run" and run.data.tags["team"] == "lightning"
    assert run.data.params["learning_rate"] == "0.01" and run.data.params["hub_token"] == "<HUB_TOKEN>"
    # The reference's MLflowCallback logs the keys as they are (no train/ or eval/ prefix).
    expected = _expected_series(trainer.state.log_history, dict)
    assert "loss" in expected and "eval_loss" in expected and "total_flos" in expected
    actual = _mlflow_series(client, run.info.run_id, run.data.metrics)
    _assert_series_equal(actual, {key: sorted(points) for key, points in expected.items()})
    _assert_no_secret(str(tmp_path / "mlruns"))
    assert os.environ["MLFLOW_TRACKING_URI"] == uri  # the user's own setting is left as it was


def test_mlflow_defaults_to_a_sqlite_store_in_output_dir(tmp_path, monkeypatch):
    """No MLFLOW_TRACKING_URI: our Lightning MLflow logger's run lands in output_dir/mlflow.db (MLflow's current
    store format); the reference's callback leaves it to MLflow (./mlflow.db)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("HF_LIGHTNING_REPORT_THROUGH", "lightning")

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), report_to="mlflow", run_name="r", use_cpu=True, max_steps=1
    )
    (spec,) = translate(args).logging.loggers
    uri = default_mlflow_tracking_uri(str(tmp_path / "out"))
    assert spec["kwargs"]["tracking_uri"] == uri == "sqlite:///" + str(tmp_path / "out" / "mlflow.db")
    (mlflow_logger,) = build_loggers(translate(args))
    mlflow_logger.log_metrics({"loss": 0.5}, step=3)
    mlflow_logger.finalize("success")
    assert (tmp_path / "out" / "mlflow.db").is_file()
    client = MlflowClient(uri)
    run = client.get_run(mlflow_logger.run_id)
    assert run.data.tags["mlflow.runName"] == "r" and run.info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == [(3, 0.5)]
    assert client.get_experiment(run.info.experiment_id).name == "Default"
    # Lightning's MLFlowLogger calls mlflow.set_tracking_uri, which exports MLFLOW_TRACKING_URI: undone, so
    # the next run of this process does not write into this run's store.
    assert "MLFLOW_TRACKING_URI" not in os.environ
    import mlflow

    assert not mlflow.is_tracking_uri_set()


def test_lightning_mlflow_logger_accepts_mlflow_skinny():
    """Only mlflow-skinny is installed: Lightning's requirement check falls back to the importable module."""
    import importlib.metadata

    from lightning.pytorch.loggers.mlflow import _MLFLOW_AVAILABLE

    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("mlflow")
    assert importlib.metadata.version("mlflow-skinny")
    assert bool(_MLFLOW_AVAILABLE)


# ------------------------------------------------------------------ wandb


def _read_wandb_records(path):
    """The records of a `.wandb` file: a 7-byte header, then LevelDB-log framing (32 KiB blocks, each
    record `crc32 u32 | length u16 | type u8 | payload`, full/first/middle/last) of `Record` protobufs."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B", data[:7]
    records, pending, position, block = [], b"", 7, 32768
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:  # a block's tail too short for a header is zero padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0:  # zero padding up to the block's end
            position += left
            continue
        if position + 7 + length > len(data):  # a record wandb-core is still writing: read it next time
            break
        payload = data[position + 7 : position + 7 + length]
        position += 7 + length
        pending = payload if kind in (1, 2) else pending + payload
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _finished_records(path, timeout=60.0):
    """The records once wandb-core has written the run's `exit` record: `wandb.finish()` can return
    before the core service has flushed the file (seen under load with wandb 0.31). A read that meets a
    record still being written (its bytes not all on disk yet) is tried again."""
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + timeout
    while True:
        try:
            records = _read_wandb_records(path)
        except DecodeError:
            records = []
        if any(record.WhichOneof("record_type") == "exit" for record in records):
            return records
        assert time.monotonic() < deadline, f"{path} has no exit record after {timeout} s"
        time.sleep(0.1)


def _wandb_history_and_summary(path):
    history, summary, run = [], {}, None
    for record in _finished_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "history":
            history.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
        elif kind == "summary":
            for item in record.summary.update:
                if item.key:  # nested_key updates are wandb's own bookkeeping
                    summary[item.key] = json.loads(item.value_json)
    return run, history, summary


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """An offline, quiet wandb whose files all land in tmp_path; no credentials anywhere."""
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_DIR", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    monkeypatch.setenv("WANDB_DISABLE_CODE", "true")
    monkeypatch.setenv("WANDB_X_DISABLE_STATS", "true")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.setenv("WANDB_PROJECT", "hf-lightning-tests")
    yield
    import wandb

    wandb.finish()


def test_wandb_offline_run_holds_the_log_history(tmp_path, wandb_env, monkeypatch):
    """Our Lightning W&B logger (the reference's own callback: tests/integrations/test_tracker_parity.py)."""
    import wandb

    monkeypatch.setenv("HF_LIGHTNING_REPORT_THROUGH", "lightning")

    trainer = _train(tmp_path, "wandb")
    assert os.environ.get("WANDB_MODE") is None  # Lightning's offline=True would have set it to "dryrun"
    wandb.finish()  # the run stays open after train(), as the reference's; close it to read it back

    (run_file,) = glob.glob(str(tmp_path / "out" / "wandb" / "offline-run-*" / "run-*.wandb"))
    run, rows, summary = _wandb_history_and_summary(run_file)
    assert run.display_name == "backend-run" and run.project == "hf-lightning-tests"
    expected_rows = []
    for entry in trainer.state.log_history:  # the reference's WandbCallback.on_log
        values = {key: value for key, value in entry.items() if key != "step" and key not in SUMMARY_ONLY}
        expected_rows.append({**reference_rewrite_logs(values), "train/global_step": entry["step"]})
    assert [row["trainer/global_step"] for row in rows] == [
        entry["step"] for entry in trainer.state.log_history
    ]
    user_rows = [
        {k: v for k, v in row.items() if not k.startswith("_") and k != "trainer/global_step"} for row in rows
    ]
    assert user_rows == expected_rows
    final = next(entry for entry in trainer.state.log_history if "train_runtime" in entry)
    assert {key: summary[key] for key in SUMMARY_ONLY} == {key: final[key] for key in SUMMARY_ONLY}
    _assert_no_secret(str(tmp_path / "out"))


def test_wandb_gets_predict_metrics_as_the_reference(tmp_path, wandb_env, monkeypatch):
    """The reference's WandbCallback.on_predict: one more history row, the rewritten `test/` metrics plus
    `train/global_step` (its `step_sync`); our Lightning W&B logger run side by side with transformers.Trainer,
    read back from both files."""
    import transformers
    import wandb

    def last_row(run_root, trainer) -> tuple[dict, dict, int]:
        metrics = trainer.predict(regression_data(6)).metrics
        wandb.finish()
        (run_file,) = glob.glob(str(run_root / "wandb" / "offline-run-*" / "run-*.wandb"))
        _, rows, _ = _wandb_history_and_summary(run_file)
        row = {key: value for key, value in rows[-1].items() if not key.startswith("_")}
        return row, metrics, len(rows)

    # The reference would ask for a login without it. wandb reads the environment when its process-wide setup
    # is made: end any setup an earlier test made, so this one reads it.
    monkeypatch.setenv("WANDB_MODE", "offline")
    wandb.teardown()
    monkeypatch.chdir(tmp_path)  # the reference's run goes to ./wandb (our Lightning logger's to output_dir/wandb)
    monkeypatch.setenv("HF_LIGHTNING_REPORT_THROUGH", "lightning")
    ours = _train(tmp_path, "wandb")
    monkeypatch.delenv("HF_LIGHTNING_REPORT_THROUGH")
    our_row, our_metrics, our_rows = last_row(tmp_path / "out", ours)
    assert our_rows == len(ours.state.log_history) + 1  # predict() adds one row, and no log_history entry

    reference_args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "reference"),
        use_cpu=True,
        save_strategy="no",
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        max_steps=4,
        logging_steps=1,
        report_to="wandb",
        run_name="reference-run",
    )
    reference = transformers.Trainer(
        model=make_regression_mlp(), args=reference_args, train_dataset=regression_data(8)
    )
    reference.train()
    reference_row, reference_metrics, _ = last_row(tmp_path, reference)

    assert our_row.pop("trainer/global_step") == 4  # Lightning's WandbLogger axis, on every row
    assert set(our_row) == set(reference_row)
    assert our_row["train/global_step"] == reference_row["train/global_step"] == 4
    assert our_row == reference_rewrite_logs(our_metrics) | {"train/global_step": 4}
    assert reference_row == reference_rewrite_logs(reference_metrics) | {"train/global_step": 4}


def test_predict_metrics_reach_comet_only_among_the_other_backends(tmp_path):
    """The reference's CometCallback.on_predict logs the rewritten metrics at `global_step`; TensorBoard, MLflow
    and CSV have no `on_predict` there, so they get nothing."""
    from lightning.pytorch.loggers import CometLogger, CSVLogger

    from hf_lightning.integrations.logger_backends import backend_for

    calls = []
    comet = CometLogger.__new__(CometLogger)  # comet_ml is not installed here: only the call is checked
    comet.log_metrics = lambda metrics, step=None: calls.append((metrics, step))
    metrics = {"test_loss": 0.5, "test_runtime": 1.0, "test_note": "text"}
    backend_for(comet).send_predict_metrics(comet, metrics, step=7, epoch=1.5)
    # All rewritten entries, as the reference's `__internal_api__log_metrics__` call; the epoch as Lightning's
    # CometLogger takes it.
    assert calls == [({"test/loss": 0.5, "test/runtime": 1.0, "test/note": "text", "epoch": 1.5}, 7)]

    csv_logger = CSVLogger(save_dir=str(tmp_path))
    backend_for(csv_logger).send_predict_metrics(csv_logger, metrics, step=7)
    csv_logger.save()
    assert not glob.glob(str(tmp_path / "**" / "metrics.csv"), recursive=True)


def test_wandb_mode_comes_from_the_environment_or_the_credentials(tmp_path, monkeypatch):
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert not wandb_credentials_configured()
    assert resolve_wandb_mode(None) == "offline"  # no key: offline, never a login prompt
    assert resolve_wandb_mode("online") == "online" and resolve_wandb_mode("disabled") == "disabled"
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password not-a-real-key\n")
    assert resolve_wandb_mode(None) == "online"  # `wandb login` wrote a .netrc entry
    assert resolve_wandb_mode(None, {"NETRC": str(tmp_path / "none"), "WANDB_API_KEY": "k"}) == "online"
    assert resolve_wandb_mode(None, {"NETRC": str(tmp_path / "none")}) == "offline"


def test_wandb_spec_reads_project_dir_and_mode():
    args = TrainingArguments(output_dir="o", report_to="wandb", run_name="r")
    installed = frozenset({"wandb"})
    (spec,) = logger_specs(args, Environment(installed_loggers=installed))
    assert spec["kwargs"] == {"name": "r", "project": "huggingface", "save_dir": "o"} and spec["mode"] is None
    environ = {"WANDB_PROJECT": "p", "WANDB_DIR": "/tmp/w", "WANDB_MODE": "offline"}
    (spec,) = logger_specs(args, Environment(installed_loggers=installed, environ=environ))
    assert spec["kwargs"] == {"name": "r", "project": "p", "save_dir": None} and spec["mode"] == "offline"


@pytest.mark.parametrize(
    ("backend", "environ", "words"),
    [
        ("wandb", {"WANDB_MODE": "sometimes"}, ["WANDB_MODE='sometimes'", "offline"]),
        ("wandb", {"WANDB_LOG_MODEL": "end"}, ["WANDB_LOG_MODEL='end'", "unset"]),
        ("wandb", {"WANDB_WATCH": "all"}, ["WANDB_WATCH='all'", "unset"]),
        ("mlflow", {"MLFLOW_NESTED_RUN": "true"}, ["MLFLOW_NESTED_RUN", "unset"]),
        ("mlflow", {"HF_MLFLOW_LOG_ARTIFACTS": "1"}, ["HF_MLFLOW_LOG_ARTIFACTS", "unset"]),
        ("mlflow", {"MLFLOW_TAGS": "not json"}, ["MLFLOW_TAGS", "JSON"]),
        ("mlflow", {"MLFLOW_TAGS": "[1, 2]"}, ["MLFLOW_TAGS", "JSON object"]),
    ],
)
def test_tracker_settings_we_cannot_honour_are_refused(backend, environ, words):
    args = TrainingArguments(output_dir="o", report_to=backend)
    with pytest.raises(ValueError) as error:
        logger_specs(args, Environment(installed_loggers=frozenset({backend}), environ=environ))
    for word in words:
        assert word in str(error.value)


# ------------------------------------------------------------------ every name the reference accepts


@pytest.mark.parametrize("name", sorted(INTEGRATION_TO_CALLBACK))
def test_every_reference_integration_is_carried_or_refused_with_the_fix(name):
    """The carrier rule (docs/design.md, "Who carries report_to"): with transformers, the reference's own callback
    carries each of the twelve names; without it, Lightning's loggers carry four and the other eight are refused
    naming what to install; neptune and kubeflow are refused either way."""
    everything = frozenset(CALLBACK_INTEGRATIONS) | {"neptune"}
    with_transformers = Environment(installed_loggers=everything, reference_integrations=True)
    without = Environment(installed_loggers=everything)
    if name in CALLBACK_INTEGRATIONS:
        assert reference_integrations([name], with_transformers) == [name]
        assert logger_specs(TrainingArguments(output_dir="o", report_to=name), with_transformers) == []
        missing = str(pytest.raises(ValueError, requested_loggers, [name], Environment(reference_integrations=True)).value)
        assert "not installed" in missing and "pip install" in missing and "remove" in missing
    if name in SUPPORTED_LOGGERS:
        assert requested_loggers([name], without) == [name] and reference_integrations([name], without) == []
        (spec,) = logger_specs(TrainingArguments(output_dir="o", report_to=name), without)
        assert spec["name"] == name
        message = str(pytest.raises(ValueError, requested_loggers, [name], Environment()).value)
        assert "not installed" in message and "pip install" in message and "remove" in message
    elif name in CALLBACK_INTEGRATIONS:
        message = str(pytest.raises(ValueError, requested_loggers, [name], without).value)
        assert f"report_to={name!r} has no Lightning logger" in message
        assert "install transformers" in message and LOGGER_PACKAGES[name][1] in message
        # transformers installed, Lightning's loggers asked for: the fix is to stop asking.
        lightning = Environment(
            installed_loggers=everything,
            reference_integrations=True,
            environ={"HF_LIGHTNING_REPORT_THROUGH": "lightning"},
        )
        message = str(pytest.raises(ValueError, requested_loggers, [name], lightning).value)
        assert "unset HF_LIGHTNING_REPORT_THROUGH" in message
    else:
        for env in (with_transformers, without):
            message = str(pytest.raises(ValueError, requested_loggers, [name], env).value)
            assert f"report_to={name!r} is not supported (" in message and "remove it from report_to" in message


def test_report_through_is_checked():
    bad = Environment(environ={"HF_LIGHTNING_REPORT_THROUGH": "sometimes"}, reference_integrations=True)
    message = str(pytest.raises(ValueError, requested_loggers, ["tensorboard"], bad).value)
    assert "HF_LIGHTNING_REPORT_THROUGH='sometimes'" in message and "reference, lightning" in message
    no_transformers = Environment(environ={"HF_LIGHTNING_REPORT_THROUGH": "reference"})
    message = str(pytest.raises(ValueError, requested_loggers, ["tensorboard"], no_transformers).value)
    assert "needs transformers" in message


def test_refusals_say_why():
    neptune = str(pytest.raises(ValueError, requested_loggers, ["neptune"], Environment()).value)
    assert "Lightning 2.6 removed NeptuneLogger" in neptune
    kubeflow = str(pytest.raises(ValueError, requested_loggers, ["kubeflow"], Environment()).value)
    assert "DISABLE_KUBEFLOW_INTEGRATION=TRUE" in kubeflow
    comet = str(pytest.raises(ValueError, requested_loggers, ["comet_ml"], Environment()).value)
    assert "comet_ml package, which is not installed" in comet and "pip install comet-ml" in comet


def test_comet_spec_reads_project_mode_and_run_name():
    environ = {"COMET_PROJECT_NAME": "p", "COMET_MODE": "create"}
    args = TrainingArguments(output_dir="o", report_to="comet_ml", run_name="r")
    (spec,) = logger_specs(args, Environment(installed_loggers=frozenset({"comet_ml"}), environ=environ))
    assert spec == {"name": "comet_ml", "kwargs": {"project": "p", "mode": "create", "name": "r"}}


def test_all_and_none(monkeypatch):
    monkeypatch.delenv("KUBEFLOW_TRAINER_SERVER_URL", raising=False)
    monkeypatch.delenv("HF_LIGHTNING_REPORT_THROUGH", raising=False)
    # TrainingArguments expands "all" the reference's way; the reference's own callbacks carry every name.
    expected = get_available_reporting_integrations()
    assert {"tensorboard", "mlflow", "wandb", "trackio"} <= set(expected)  # installed in the test environment
    plan = translate(TrainingArguments(output_dir="o", report_to="all"))
    assert list(plan.logging.integrations) == expected and plan.logging.loggers == ()
    assert translate(TrainingArguments(output_dir="o", report_to="none")).logging == translate(
        TrainingArguments(output_dir="o")
    ).logging
    # Lightning's loggers asked for: the installed names they carry, the others left out of "all".
    monkeypatch.setenv("HF_LIGHTNING_REPORT_THROUGH", "lightning")
    plan = translate(TrainingArguments(output_dir="o", report_to="all"))
    assert [spec["name"] for spec in plan.logging.loggers] == [n for n in expected if n in SUPPORTED_LOGGERS]
    assert plan.logging.integrations == ()
    # Unexpanded (duck-typed arguments): "all" keeps the installed names of the carrier, in the reference's order.
    installed = frozenset({"tensorboard", "neptune", "trackio", "mlflow", "azure_ml", "dvclive"})
    assert requested_loggers("all", Environment(installed_loggers=installed)) == ["mlflow", "tensorboard"]
    with_transformers = Environment(installed_loggers=installed, reference_integrations=True)
    assert requested_loggers("all", with_transformers) == ["dvclive", "mlflow", "tensorboard", "trackio"]


def test_the_reference_callbacks_are_attached_in_the_reference_order(tmp_path, monkeypatch):
    """Our trainer's callback list equals transformers.Trainer's for the same report_to: flow callback, the
    integrations' own callbacks in report_to's order, then the user's and the progress callback."""
    import transformers

    monkeypatch.chdir(tmp_path)
    names = ["trackio", "tensorboard", "dvclive"]
    user = transformers.TrainerCallback()

    def kinds(trainer):
        return [type(callback).__name__ for callback in trainer.callback_handler.callbacks]

    reference = transformers.Trainer(
        model=make_regression_mlp(),
        args=transformers.TrainingArguments(output_dir=str(tmp_path / "r"), report_to=names, use_cpu=True),
        callbacks=[user],
    )
    ours = HFLightningTrainer(
        model=make_regression_mlp(),
        args=TrainingArguments(output_dir=str(tmp_path / "o"), report_to=names, use_cpu=True),
        callbacks=[user],
    )
    assert kinds(ours) == kinds(reference)
    assert kinds(ours)[1:4] == ["TrackioCallback", "TensorBoardCallback", "DVCLiveCallback"]


def test_rewrite_logs_matches_the_reference():
    from transformers.integrations.integration_utils import rewrite_logs as reference

    from hf_lightning.integrations.logger_backends.base import rewrite_logs

    logs = {"loss": 1.0, "eval_loss": 2.0, "test_acc": 0.5, "learning_rate": 1e-3, "evaluation": 3}
    assert rewrite_logs(logs) == reference(logs)


def test_without_transformers_lightning_loggers_carry_report_to(tmp_path):
    """transformers unimportable: tensorboard is our Lightning logger (its run under output_dir/runs, the perf/
    figures beside the reference's keys), and a name only the reference's callbacks carry is refused naming what to
    install, before training."""
    import subprocess
    import sys
    import textwrap

    from tests.no_transformers import BLOCK_TRANSFORMERS

    script = BLOCK_TRANSFORMERS + textwrap.dedent(
        f"""
        import glob
        from hf_lightning import Trainer, TrainingArguments
        from tests.models import make_regression_mlp, regression_data

        def args(report_to):
            return TrainingArguments(output_dir={str(tmp_path)!r}, use_cpu=True, per_device_train_batch_size=2,
                                     logging_steps=1, max_steps=2, save_strategy="no", disable_tqdm=True,
                                     report_to=report_to)

        trainer = Trainer(model=make_regression_mlp(), args=args("tensorboard"), train_dataset=regression_data(4))
        assert trainer.callback_handler.callback_list.count("TensorBoardCallback") == 0
        trainer.train()
        assert [type(l).__name__ for l in trainer.lightning_trainer.loggers] == ["TensorBoardLogger"]
        assert glob.glob({str(tmp_path / "runs" / "*" / "events.out.tfevents.*")!r})
        try:
            Trainer(model=make_regression_mlp(), args=args("trackio"), train_dataset=regression_data(4))
        except ValueError as error:
            assert "has no Lightning logger" in str(error) and "pip install trackio" in str(error), error
        else:
            raise AssertionError("report_to='trackio' was accepted without transformers")
        assert "transformers" not in sys.modules
        print("OK")
        """
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=root)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]
