"""Where the telemetry shows (Lightning loggers under `perf/`, the progress bar, the summary; log_history only when
asked), evaluate() / predict() figures, and that switching it off changes nothing else in a run."""

from __future__ import annotations

import csv
import glob
import json
import os

import pytest
import torch

from hf_lightning import Seq2SeqTrainingArguments, Telemetry, Trainer, TrainingArguments
from hf_lightning.trainer.seq2seq import HFLightningSeq2SeqTrainer
from tests.models import DropoutMLP, make_tiny_gpt2, padded_lm_data, regression_data

TIMING_SUFFIXES = ("_runtime", "_per_second")


def _args(output_dir, **fields) -> TrainingArguments:
    defaults = dict(output_dir=str(output_dir), report_to="none", disable_tqdm=True, save_strategy="no", use_cpu=True)
    return TrainingArguments(**{**defaults, **fields})


def _untimed(entries: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if not k.endswith(TIMING_SUFFIXES)} for entry in entries]


def _csv_rows(output_dir) -> list[dict]:
    (path,) = glob.glob(str(output_dir / "**" / "metrics.csv"), recursive=True)
    with open(path, encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _files(output_dir) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(folder, name), output_dir)
        for folder, _, names in os.walk(output_dir)
        for name in names
    )


def _dropout_run(output_dir, **trainer_kwargs):
    args = _args(output_dir, per_device_train_batch_size=2, max_steps=8, logging_steps=2, eval_strategy="steps",
                 eval_steps=4, save_strategy="steps", save_steps=4, report_to="csv", learning_rate=1e-2)
    trainer = Trainer(model=DropoutMLP(0), args=args, train_dataset=regression_data(20),
                      eval_dataset=regression_data(6, seed=1), **trainer_kwargs)
    trainer.train()
    return trainer, torch.random.get_rng_state()


def test_switching_the_telemetry_off_changes_nothing_else(tmp_path, capsys):
    on, on_rng = _dropout_run(tmp_path / "on")
    on_printed = capsys.readouterr().out
    off, off_rng = _dropout_run(tmp_path / "off", telemetry=False)
    off_printed = capsys.readouterr().out
    assert on._telemetry is not None and off._telemetry is None
    # Same updates (dropout draws from the same stream: the FLOP measurement drew no random number), same logs.
    assert torch.equal(on_rng, off_rng)
    for (name, ours), theirs in zip(on.model.state_dict().items(), off.model.state_dict().values()):
        assert torch.equal(ours, theirs), name
    assert _untimed(on.state.log_history) == _untimed(off.state.log_history)
    assert not any(key.startswith("perf/") for entry in on.state.log_history for key in entry)
    # The same files (the summary is printed, not written); checkpoints' trainer states the same but for timings.
    assert _files(tmp_path / "on") == _files(tmp_path / "off")
    for checkpoint in ("checkpoint-4", "checkpoint-8"):
        states = [json.loads((tmp_path / side / checkpoint / "trainer_state.json").read_text()) for side in ("on", "off")]
        for state in states:
            state["log_history"] = _untimed(state["log_history"])
        assert states[0] == states[1]
    # The loggers get the figures under perf/ beside the reference's keys, which are the same on both sides.
    on_rows, off_rows = _csv_rows(tmp_path / "on"), _csv_rows(tmp_path / "off")
    perf_columns = {key for key in on_rows[0] if key.startswith("perf/")}
    assert {"perf/samples_per_second", "perf/data_wait_share", "perf/eval_samples_per_second"} <= perf_columns
    assert not any(key.startswith("perf/") for key in off_rows[0])
    assert set(on_rows[0]) - perf_columns == set(off_rows[0])
    losses = [{(row["step"], row["train/loss"]) for row in rows if row.get("train/loss")} for rows in (on_rows, off_rows)]
    assert losses[0] == losses[1] and len(losses[0]) == 4
    assert "***** Run performance" in on_printed and "Run performance" not in off_printed
    assert on_printed.replace(on_printed[on_printed.index("***** Run performance"):], "").count("{'loss'") == 4


def test_log_history_gets_the_figures_when_asked(tmp_path):
    args = _args(tmp_path, per_device_train_batch_size=2, max_steps=4, logging_steps=2, eval_strategy="steps",
                 eval_steps=4)
    trainer = Trainer(model=make_tiny_gpt2(), args=args, train_dataset=padded_lm_data(8),
                      eval_dataset=padded_lm_data(4, seed=1), callbacks=[Telemetry(log_history=True)])
    trainer.train()
    training_entries = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(training_entries) == 2
    for entry in training_entries:
        assert entry["perf/tokens_per_second"] > 0 and 0 <= entry["perf/data_wait_share"] <= 1
    (evaluation,) = [entry for entry in trainer.state.log_history if "eval_loss" in entry]
    assert evaluation["perf/eval_tokens_per_second"] > 0


def test_the_summary_and_the_progress_bar_can_be_switched_off_alone(tmp_path, capsys):
    def run(output_dir, telemetry):
        args = _args(output_dir, per_device_train_batch_size=2, max_steps=4, logging_steps=2, disable_tqdm=False)
        Trainer(model=make_tiny_gpt2(), args=args, train_dataset=padded_lm_data(8), telemetry=telemetry).train()
        return capsys.readouterr()

    shown = run(tmp_path / "shown", True)
    assert "tokens/s=" in shown.err and "***** Run performance" in shown.out
    assert not (tmp_path / "shown" / "run_performance.json").exists()  # output_dir holds what the reference writes
    quiet = run(tmp_path / "quiet", Telemetry(progress_bar=False, summary=False))
    assert "tokens/s=" not in quiet.err and "Run performance" not in quiet.out
    assert not (tmp_path / "quiet" / "run_performance.json").exists()
    written = run(tmp_path / "written", Telemetry(summary_file=True))
    assert f"Run performance ({tmp_path / 'written' / 'run_performance.json'})" in written.out
    assert json.loads((tmp_path / "written" / "run_performance.json").read_text())["global_step"] == 4


def test_evaluate_and_predict_measure_samples_and_tokens_per_second(tmp_path):
    data = padded_lm_data(6, seed=2)
    tokens = sum(int(item["attention_mask"].sum()) for item in data.items)
    args = _args(tmp_path, per_device_eval_batch_size=4, report_to="csv")
    trainer = Trainer(model=make_tiny_gpt2(), args=args, eval_dataset=data, telemetry=Telemetry(log_history=True))
    metrics = trainer.evaluate()
    # One pass, one time: tokens/s over samples/s is the counted tokens per sample.
    assert metrics["perf/eval_tokens_per_second"] / metrics["perf/eval_samples_per_second"] == pytest.approx(tokens / 6)
    assert metrics["perf/eval_samples_per_second"] > 0
    trainer.predict(data)
    rows = _csv_rows(tmp_path)
    (row,) = [row for row in rows if row.get("perf/test_tokens_per_second")]
    assert float(row["perf/test_tokens_per_second"]) / float(row["perf/test_samples_per_second"]) == pytest.approx(
        tokens / 6
    )
    plain = Trainer(model=make_tiny_gpt2(), args=_args(tmp_path / "plain"), eval_dataset=data)
    off = Trainer(model=make_tiny_gpt2(), args=_args(tmp_path / "off"), eval_dataset=data, telemetry=False)
    assert list(plain.evaluate()) == list(off.evaluate())  # the reference's keys unless asked


def test_the_seq2seq_trainer_takes_the_keyword(tmp_path):
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    trainer = HFLightningSeq2SeqTrainer(model=make_tiny_gpt2(), args=args, telemetry=False)
    assert trainer._telemetry is None
    with pytest.raises(TypeError, match="telemetry="):
        Trainer(model=make_tiny_gpt2(), args=_args(tmp_path), telemetry="yes")
