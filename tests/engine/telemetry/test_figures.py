"""The telemetry's pure parts: rates, MFU and shares of a stretch, the summary, the options, blocked time."""

from __future__ import annotations

import time

import pytest
import torch

from hf_lightning.core.blocked_time import BlockedTime, blocked_by
from hf_lightning.engine.telemetry.clocks import HostClock
from hf_lightning.engine.telemetry.counting import BatchCounter
from hf_lightning.engine.telemetry.figures import Totals, figures, progress_text, summary, summary_text
from hf_lightning.engine.telemetry.flops import FlopsRule, device_peak_flops
from hf_lightning.engine.telemetry.settings import OFF, TelemetrySettings, resolve_telemetry


def _totals(**values) -> Totals:
    base = dict(seconds=2.0, updates=4, samples=64, samples_local=32, tokens=1000, tokens_local=600, flops=8e9)
    return Totals(**{**base, **values})


def test_rates_are_counts_over_the_stretch_and_mfu_is_flops_over_time_devices_and_peak():
    window = figures(_totals(data_wait=0.5, optimizer=0.25), world_size=2, peak_flops=1e9)
    assert window["seconds_per_step"] == 0.5
    assert window["samples_per_second"] == 32.0
    assert window["samples_per_second_per_device"] == 16.0
    assert window["tokens_per_second"] == 500.0
    assert window["tokens_per_second_per_device"] == 300.0
    assert window["flops_per_step"] == 2e9
    assert window["flops_per_second_per_device"] == pytest.approx(8e9 / 2.0 / 2)
    assert window["mfu"] == pytest.approx(8e9 / 2.0 / 2 / 1e9)
    assert window["data_wait_share"] == 0.25 and window["optimizer_share"] == 0.125
    assert window["other_share"] == pytest.approx(0.625)


def test_no_peak_no_mfu_and_no_flops_no_flops_figures():
    assert "mfu" not in figures(_totals(), world_size=1, peak_flops=None)
    window = figures(_totals(flops=None), world_size=1, peak_flops=1e12)
    assert "mfu" not in window and "flops_per_step" not in window
    assert "tokens_per_second" not in figures(_totals(tokens=None, tokens_local=None), 1, None)
    assert figures(_totals(updates=0), 1, None) == {}


def test_a_stretch_with_fewer_tokens_than_samples_still_has_its_token_rate():
    window = figures(_totals(tokens=10, tokens_local=5), world_size=2, peak_flops=None)
    assert window["tokens_per_second_per_device"] == 2.5


def test_shares_add_up_to_one_and_generation_shows_only_when_it_happened():
    totals = _totals(data_wait=0.2, optimizer=0.2, blocked={"evaluation": 0.4, "checkpoint": 0.3, "hub": 0.1,
                                                              "generation": 0.0})
    window = figures(totals, 1, None)
    shares = {key: value for key, value in window.items() if key.endswith("_share")}
    assert "generation_share" not in shares
    assert sum(shares.values()) == pytest.approx(1.0)
    totals.blocked["generation"] = 0.5
    assert figures(totals, 1, None)["generation_share"] == 0.25


def test_run_totals_fold_windows():
    run = Totals()
    run.add(_totals(peak_memory=10))
    run.add(_totals(tokens=None, tokens_local=None, peak_memory=30))
    assert (run.updates, run.samples, run.tokens, run.flops, run.peak_memory) == (8, 128, 1000, 16e9, 30)


def test_summary_and_its_printed_form():
    run = _totals(data_wait=0.5)
    context = {"global_step": 4, "device": "cpu", "compute_dtype": "float32", "peak_flops_source": None,
               "flops_source": "floating_point_ops", "memory_kind": "process_max_resident", "startup_seconds": 1.0}
    content = summary(run, world_size=1, peak_flops=None, context=context, windows=[], passes=[])
    assert content["time_breakdown"]["data_wait"] == {"seconds": 0.5, "share": 0.25}
    assert content["whole_run"]["tokens_per_second"] == 500.0
    text = summary_text(content, "/out/run_performance.json")
    assert "tokens/s 500" in text and "waiting for data 25.0%" in text
    assert "MFU unknown" in text and "peak_flops" in text


def test_progress_text():
    assert progress_text({"tokens_per_second": 12345.0, "samples_per_second": 3.0, "mfu": 0.4123}) == (
        "tokens/s=12.3k, MFU=41.2%"
    )
    assert progress_text({"samples_per_second": 3.0}) == "samples/s=3"
    assert progress_text({}) == ""


def test_blocked_time_counts_nested_causes_once():
    blocked = BlockedTime()
    with blocked.measure("checkpoint"):
        time.sleep(0.02)
        with blocked.measure("hub"):
            time.sleep(0.03)
    taken = blocked.take()
    assert taken["hub"] >= 0.03
    assert 0.02 <= taken["checkpoint"] < 0.03 + 0.02  # the push inside the save is Hub time only
    assert blocked.take()["checkpoint"] == 0.0
    with pytest.raises(ValueError, match="unknown cause"):
        with blocked.measure("lunch"):
            pass


def test_blocked_by_is_a_no_op_without_telemetry():
    class Bare:
        _telemetry = None

    with blocked_by(Bare(), "checkpoint"), blocked_by(Bare(), "hub"):
        pass


def test_the_batch_counter_follows_the_non_padding_rule():
    counter = BatchCounter("input_ids", pad_token_id=0)
    ids = torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0]])
    counter.count({"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])})
    counter.count({"input_ids": ids})  # no mask: entries other than the pad id
    assert counter.take() == (4, None, 4 + 3)
    plain = BatchCounter("input_ids", pad_token_id=None)
    plain.count({"input_ids": ids})  # no mask, no pad id: every entry
    plain.count({"x": torch.zeros(3, 2)})  # no main input: samples only
    assert plain.take() == (5, None, 8)
    assert BatchCounter("input_ids", None).take() == (0, None, None)


def test_the_batch_counter_makes_its_flops_rule_once_on_the_first_batch():
    calls = []

    def make(inputs, elements):
        calls.append((inputs, elements))
        return FlopsRule(per_element=50.0, per_position=2.0, source="test")

    counter = BatchCounter("input_ids", None, make)
    counter.count({"input_ids": torch.ones(2, 4, dtype=torch.long)})
    counter.count({"input_ids": torch.ones(2, 8, dtype=torch.long)})
    assert len(calls) == 1 and calls[0][1] == 8 and counter.flops_rule.source == "test"
    # 50 per entry and 2 per entry and position: (8 + 16) x 50 + (8 x 4 + 16 x 8) x 2
    assert counter.take() == (4, 24 * 50.0 + 160 * 2.0, 24)


def test_host_clock_adds_its_intervals():
    clock = HostClock()
    for _ in range(2):
        clock.start()
        time.sleep(0.01)
        clock.stop()
    assert 0.02 <= clock.read_and_reset() < 0.2
    assert clock.read_and_reset() == 0.0


def test_peak_flops_come_from_lightning_and_a_cpu_has_none(monkeypatch):
    assert device_peak_flops(torch.device("cpu"), torch.float32) is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    from lightning.fabric.utilities.throughput import get_available_flops

    expected = get_available_flops(torch.device("cuda", 0), torch.bfloat16)
    assert expected and device_peak_flops(torch.device("cuda", 0), torch.bfloat16) == float(expected)


def test_options_are_checked_and_resolved():
    from hf_lightning import Telemetry

    assert resolve_telemetry(None, []) == (TelemetrySettings(), None)
    assert resolve_telemetry(False, []) == (OFF, None)
    callback = Telemetry(peak_flops=5e12)
    assert resolve_telemetry(True, [callback]) == (callback.telemetry_settings, callback)
    assert resolve_telemetry(callback, []) == (callback.telemetry_settings, callback)
    with pytest.raises(ValueError, match="both given"):
        resolve_telemetry(Telemetry(), [callback])
    with pytest.raises(ValueError, match="2 hf_lightning.Telemetry"):
        resolve_telemetry(None, [callback, Telemetry()])
    with pytest.raises(TypeError, match="pass True"):
        resolve_telemetry("on", [])
    with pytest.raises(ValueError, match="positive number"):
        Telemetry(peak_flops=-1)
    with pytest.raises(TypeError, match="True or False"):
        Telemetry(log_history="yes")
