"""What the telemetry measures in a training run: tokens/s from the counted tokens, the data wait, the checkpoint
stall, FLOPs and MFU; the summary it prints and, with `summary_file=True`, writes (run_performance.json)."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch
from lightning.fabric.utilities.throughput import measure_flops
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from torch.utils.data import Dataset, default_collate

from hf_lightning import Telemetry, Trainer, TrainingArguments
from hf_lightning.checkpoint.fault_points import fault_hook
from tests.models import RegressionMLP, make_regression_mlp, make_tiny_gpt2, padded_lm_data, regression_data


def _args(tmp_path, **fields) -> TrainingArguments:
    defaults = dict(output_dir=str(tmp_path), report_to="none", disable_tqdm=True, save_strategy="no", use_cpu=True)
    return TrainingArguments(**{**defaults, **fields})


def _summary(tmp_path) -> dict:
    with open(tmp_path / "run_performance.json", encoding="utf-8") as handle:
        return json.load(handle)


class SleepyDataset(Dataset):
    """A dataset whose items take `seconds` each to read (a slow disk, a heavy decode)."""

    def __init__(self, items: Dataset, seconds: float) -> None:
        self.items, self.seconds = items, seconds

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        if self.seconds:  # sleep(0) would still yield the core to whoever else runs
            time.sleep(self.seconds)
        return self.items[index]


def test_tokens_per_second_is_the_counted_tokens_over_the_measured_time(tmp_path):
    data = padded_lm_data(12)  # right-padded: 3 to 10 real tokens in rows of 10
    batches: list[int] = []  # non-padding tokens of each batch, in the order training draws them

    def collate(items):
        batch = default_collate(items)
        batches.append(int(batch["attention_mask"].sum()))
        return batch

    args = _args(tmp_path, per_device_train_batch_size=2, num_train_epochs=1, logging_steps=2,
                 include_num_input_tokens_seen="non_padding")
    trainer = Trainer(telemetry=Telemetry(summary_file=True), model=make_tiny_gpt2(), args=args, train_dataset=data, data_collator=collate)
    trainer.train()
    content = _summary(tmp_path)
    all_tokens = sum(int(item["attention_mask"].sum()) for item in data.items)
    assert all_tokens < 12 * 10  # the padding is not counted
    assert len(batches) == 6 and sum(batches) == all_tokens
    assert content["tokens"] == all_tokens == trainer.state.num_input_tokens_seen
    run = content["whole_run"]
    assert run["tokens_per_second"] == pytest.approx(all_tokens / content["training_seconds"], rel=1e-12)
    assert run["samples_per_second"] == pytest.approx(12 / content["training_seconds"], rel=1e-12)
    windows = content["windows"]
    assert [window["step"] for window in windows] == [2, 4, 6]
    for index, window in enumerate(windows):
        seconds = window["seconds_per_step"] * 2
        assert window["tokens_per_second"] * seconds == pytest.approx(sum(batches[2 * index:2 * index + 2]))
        assert window["tokens_per_second_per_device"] == window["tokens_per_second"]  # one process
        assert window["samples_per_second"] * seconds == pytest.approx(4)


@pytest.mark.parametrize("seconds_per_item", [0.0, 0.02])
def test_a_slow_dataset_shows_as_data_wait(tmp_path, seconds_per_item):
    data = SleepyDataset(regression_data(48), seconds_per_item)
    args = _args(tmp_path, per_device_train_batch_size=4, max_steps=12, logging_steps=4)
    Trainer(telemetry=Telemetry(summary_file=True), model=make_regression_mlp(), args=args, train_dataset=data).train()
    content = _summary(tmp_path)
    share = content["time_breakdown"]["data_wait"]["share"]
    if seconds_per_item:
        assert content["time_breakdown"]["data_wait"]["seconds"] >= 12 * 4 * seconds_per_item
        assert share > 0.6, content["time_breakdown"]
        assert all(window["data_wait_share"] > 0.5 for window in content["windows"])
    else:
        assert share < 0.25, content["time_breakdown"]


def _slow_fsync(seconds: float, on_main_thread: bool, times: int | None = None):
    """A fault hook making a save's fsync (one per save) take `seconds` longer on the thread that writes, for the
    first `times` saves (all when None)."""
    slowed: list[str] = []

    def hook(point: str) -> None:
        if point == "fsync" and (threading.current_thread() is threading.main_thread()) == on_main_thread:
            if times is None or len(slowed) < times:
                slowed.append(point)
                time.sleep(seconds)

    return hook


def test_slow_saves_show_their_stall(tmp_path):
    args = _args(tmp_path, per_device_train_batch_size=4, max_steps=6, logging_steps=2, save_strategy="steps",
                 save_steps=2)
    with fault_hook(_slow_fsync(0.25, on_main_thread=True)):
        Trainer(telemetry=Telemetry(summary_file=True), model=make_regression_mlp(), args=args, train_dataset=regression_data(24)).train()
    content = _summary(tmp_path)
    stall = content["time_breakdown"]["checkpoint"]
    assert stall["seconds"] >= 3 * 0.25
    assert stall["share"] > 0.5, content["time_breakdown"]
    # A step's boundary logs, then saves: the save at step 2 falls in the window that ends at step 4.
    shares = [window["checkpoint_share"] for window in content["windows"]]
    assert shares[0] < 0.2 and shares[1] > 0.4 and shares[2] > 0.4, shares


def test_with_async_writes_the_stall_is_what_the_save_blocks(tmp_path):
    """With the AsyncCheckpointIO plugin the write runs on the writer thread while training goes on: the stall is
    the snapshot only, where the synchronous run stands still for the whole write."""
    stalls = {}
    for asynchronous in (False, True):
        output_dir = tmp_path / ("async" if asynchronous else "sync")
        args = _args(output_dir, per_device_train_batch_size=2, max_steps=8, logging_steps=4, save_strategy="steps",
                     save_steps=4)
        data = SleepyDataset(regression_data(16), 0.04)
        trainer = Trainer(telemetry=Telemetry(summary_file=True), model=make_regression_mlp(), args=args, train_dataset=data)
        if asynchronous:
            trainer.lightning_trainer_overrides = {"plugins": [AsyncCheckpointIO()]}
        # The step-4 write takes 0.25 s longer; the 4 steps after it take 0.08 s each, so it is done before step 8's.
        with fault_hook(_slow_fsync(0.25, on_main_thread=not asynchronous, times=1)):
            trainer.train()
        stalls[asynchronous] = _summary(output_dir)["time_breakdown"]["checkpoint"]["seconds"]
    assert stalls[False] >= 0.25, stalls
    assert stalls[True] < stalls[False] - 0.2, stalls


def test_mfu_is_flops_over_time_over_the_given_peak(tmp_path):
    with torch.device("meta"):
        meta_model = RegressionMLP()
        x, labels = torch.empty(4, 4), torch.empty(4)
    per_batch = measure_flops(meta_model, lambda: meta_model(x, labels), lambda output: output["loss"])
    args = _args(tmp_path, per_device_train_batch_size=4, max_steps=6, logging_steps=2)
    telemetry = Telemetry(peak_flops=1e9, summary_file=True, flops="measure")
    trainer = Trainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(24), telemetry=telemetry)
    trainer.train()
    content = _summary(tmp_path)
    assert telemetry.summary == content == trainer._telemetry.last_summary
    assert content["flops_source"] == "measure_flops on the meta device"
    assert content["peak_flops_per_device"] == 1e9 and content["peak_flops_source"] == "Telemetry(peak_flops=...)"
    assert content["flops"] == per_batch * 6
    run = content["whole_run"]
    assert run["flops_per_step"] == per_batch
    assert run["mfu"] == pytest.approx(content["flops"] / content["training_seconds"] / 1e9, rel=1e-12)
    for window in content["windows"]:
        assert window["mfu"] == pytest.approx(window["flops_per_step"] / window["seconds_per_step"] / 1e9, rel=1e-9)


def test_on_a_cpu_without_a_peak_mfu_is_absent_and_the_reference_count_stands_in(tmp_path, capsys):
    args = _args(tmp_path, per_device_train_batch_size=2, max_steps=4, logging_steps=2)
    trainer = Trainer(telemetry=Telemetry(summary_file=True), model=make_tiny_gpt2(), args=args, train_dataset=padded_lm_data(8))
    trainer.train()
    content = _summary(tmp_path)
    assert content["peak_flops_per_device"] is None and "mfu" not in content["whole_run"]
    assert all("mfu" not in window for window in content["windows"])
    # Counted from GPT-2's config (its model code not run), attention included: above the reference's 6 x N x tokens.
    assert content["flops_source"].startswith("6 x N x tokens + attention 12 x 2 layers x 16")
    assert content["flops"] > trainer.state.total_flos
    printed = capsys.readouterr().out
    assert "***** Run performance" in printed and "MFU unknown" in printed and "run_performance.json" in printed
    assert content["memory_kind"] == "process_max_resident" and content["whole_run"]["peak_memory_mb"] > 0


def test_evaluation_during_training_is_its_own_share_and_pass(tmp_path):
    args = _args(tmp_path, per_device_train_batch_size=2, max_steps=4, logging_steps=2, eval_strategy="steps",
                 eval_steps=2)
    eval_data = padded_lm_data(6, seed=1)
    Trainer(telemetry=Telemetry(summary_file=True), model=make_tiny_gpt2(), args=args, train_dataset=padded_lm_data(8),
            eval_dataset=SleepyDataset(eval_data, 0.03)).train()
    content = _summary(tmp_path)
    assert content["time_breakdown"]["evaluation"]["seconds"] >= 2 * 6 * 0.03
    passes = content["evaluations"]
    assert [(p["kind"], p["prefix"], p["step"], p["samples"]) for p in passes] == [
        ("evaluate", "eval", 2, 6), ("evaluate", "eval", 4, 6)
    ]
    tokens = sum(int(item["attention_mask"].sum()) for item in eval_data.items)
    for evaluation in passes:
        assert evaluation["tokens"] == tokens
        assert evaluation["tokens_per_second"] == pytest.approx(tokens / evaluation["seconds"])
