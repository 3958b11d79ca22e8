"""The CI performance guard's judgement (benchmarks/guard.py): a figure within its bound holds, a drift past it
fails, a missing runner fails; the ratios are paired per repeat."""

from __future__ import annotations

from benchmarks.guard import DRIFT, GUARDED, judge


def _results(ours_ms: float, ours_rss: float = 400.0) -> list[dict]:
    runners = (("hand", 1.0, 300.0), ("transformers", 2.0, 500.0), ("hf_lightning", ours_ms, ours_rss))
    return [
        {
            "workload": "tiny", "runner": runner, "repeat": repeat, "cpu_ms_per_step": ms * (1 + repeat / 100),
            "first_step_cpu_s": 1.0 if runner == "hf_lightning" else 1.5, "peak_rss_mb": rss,
        }  # fmt: skip
        for repeat in range(3)
        for runner, ms, rss in runners
    ]


def test_figures_within_their_bounds_hold():
    assert all(row["holds"] for row in judge(_results(ours_ms=1.2)))


def test_a_drift_past_a_bound_fails_and_is_named():
    bound = dict(((m, b), f) for m, b, f in GUARDED)[("cpu_ms_per_step", "hand")] * DRIFT
    rows = {(row["metric"], row["baseline"]): row for row in judge(_results(ours_ms=bound * 1.05))}
    assert not rows[("cpu_ms_per_step", "hand")]["holds"]
    assert rows[("peak_rss_mb", "transformers")]["holds"]


def test_a_missing_runner_fails():
    results = [r for r in _results(ours_ms=1.2) if r["runner"] != "transformers"]
    rows = {(row["metric"], row["baseline"]): row for row in judge(results)}
    assert not rows[("cpu_ms_per_step", "transformers")]["holds"] and rows[("cpu_ms_per_step", "hand")]["holds"]
