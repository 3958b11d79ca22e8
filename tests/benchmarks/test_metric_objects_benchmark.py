"""benchmarks/metric_objects.py: one in-process run per runner at a tiny size agrees on the accuracy, the
summary judges its targets, and its rows of the README's targets table are the ones the report renders."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks import metric_objects  # noqa: E402


def test_runners_agree_at_a_tiny_size():
    results = [metric_objects.run_one(runner, 96, 7) for runner in metric_objects.RUNNERS]
    assert len({round(r["accuracy"], 6) for r in results}) == 1
    assert len({round(r["f1"], 5) for r in results}) == 1
    assert all(r["samples_per_s"] > 0 and r["rss_growth_mb"] >= 0 for r in results)


def test_summary_judges_the_targets():
    def result(runner, samples, growth, speed):
        return {
            "runner": runner,
            "samples": samples,
            "rss_growth_mb": growth,
            "samples_per_s": speed,
            "accuracy": 0.5,
        }

    results = [
        result("transformers", 4000, 40.0, 100.0), result("transformers", 16000, 160.0, 100.0),
        result("hf_lightning", 4000, 2.0, 120.0), result("hf_lightning", 16000, 3.0, 90.0),
        result("hf_lightning_callable", 4000, 40.0, 100.0), result("hf_lightning_callable", 16000, 160.0, 100.0),
    ]  # fmt: skip
    summary = metric_objects.summarise(results, (4000, 16000))
    assert [(t["measured"], t["met"]) for t in summary["targets"]] == [
        (1.0, True), (3.0 / 160.0, True), (1.2, True), (0.9, False)
    ]  # fmt: skip
    assert summary["accuracy_agrees"]
    assert "**missed**" in metric_objects.markdown(summary, "full", 1)


def test_the_readme_targets_table_has_the_benchmark_rows():
    readme = (REPO / "benchmarks" / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| metric_objects |")]
    assert [row.split(" | ")[1] for row in rows] == [
        row.split(" | ")[1] for row in metric_objects.target_rows(None)
    ]
    assert metric_objects.TABLE_START in readme and metric_objects.TABLE_END in readme
