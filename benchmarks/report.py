"""Aggregation of the job results: medians with min-max, paired ratios, loss agreement, targets, tables.

Pure functions over the list of job results written by the workers, so they are testable alone.
A ratio is computed per repeat (both runs of one repeat ran back to back) and summarised by its median
and min-max, which cancels slow drifts of a shared machine better than a ratio of medians.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

OURS = "hf_lightning"
LOSS_RTOL = 1e-3

# Metrics summarised per (workload, runner), in table order.
TRAIN_METRICS = (
    "ms_per_step",
    "cpu_ms_per_step",
    "first_step_wall_s",
    "first_step_cpu_s",
    "imports_cpu_s",
    "peak_rss_mb",
    "cpu_share",
    "final_loss",
)
EVAL_METRICS = (
    "evaluate_samples_per_s",
    "predict_samples_per_s",
    "first_evaluate_s",
    "first_predict_s",
    "eval_loss",
    "peak_rss_mb",
)
CKPT_METRICS = (
    "first_save_s",
    "save_s",
    "save_without_fsync_s",
    "fsync_s",
    "fsync_calls",
    "resume_load_s",
    "fresh_to_train_begin_s",
    "resume_to_train_begin_s",
    "checkpoint_bytes",
    "async_first_save_s",
    "async_save_s",
)
DDP_METRICS = ("cls_steps_per_s", "clm_steps_per_s", "cls_final_loss", "clm_final_loss")
# `resume`: per dataset kind, the growth (largest position / smallest), then the time at each position; for the
# plain iterable one, what resuming further adds over the bare cost of drawing the skipped examples, and that cost.
RESUME_KINDS = ("map", "iterable", "stateful")

# (workload, metric, baseline runner, comparison, threshold): our value / baseline's must be <= (or >=) it. The
# baseline `self` judges our own value (the resume growth: the time at the largest position / at the smallest).
TARGETS = (
    ("tiny", "ms_per_step", "transformers", "<=", 0.8),
    ("tiny", "ms_per_step", "hand", "<=", 1.25),
    ("tiny", "ms_per_step", "lightning", "<=", 1.15),
    # The telemetry (on by default) against the same run with `telemetry=False`: at most 1% of a step.
    ("tiny", "ms_per_step", "hf_lightning_telemetry_off", "<=", 1.01),
    ("cls", "ms_per_step", "hf_lightning_telemetry_off", "<=", 1.01),
    ("cls", "ms_per_step", "hand", "<=", 1.03),
    ("clm", "ms_per_step", "hand", "<=", 1.03),
    ("tiny", "first_step_cpu_s", "transformers", "<=", 1.0),
    ("cls", "first_step_cpu_s", "transformers", "<=", 1.0),
    ("clm", "first_step_cpu_s", "transformers", "<=", 1.0),
    ("tiny", "peak_rss_mb", "transformers", "<=", 1.0),
    ("cls", "peak_rss_mb", "transformers", "<=", 1.0),
    ("clm", "peak_rss_mb", "transformers", "<=", 1.0),
    ("eval", "evaluate_samples_per_s", "transformers", ">=", 1.0),
    ("eval", "predict_samples_per_s", "transformers", ">=", 1.0),
    ("ckpt", "save_s", "bare", "<=", 1.5),
    ("ckpt", "first_save_s", "transformers", "<=", 1.2),
    ("ckpt", "async_save_s", "transformers", "<=", 0.5),
    ("ddp", "cls_steps_per_s", "transformers", ">=", 1.0),
    ("ddp", "clm_steps_per_s", "transformers", ">=", 1.0),
    ("resume", "map_growth", "self", "<=", 1.25),
    ("resume", "iterable_growth", "self", "<=", 1.25),
    # A plain iterable dataset's skipped examples must be drawn: the least a resume can add is their draw.
    ("resume", "iterable_skip_over_draw", "self", "<=", 1.25),
    ("resume", "stateful_growth", "self", "<=", 1.25),
)
SELF = "self"
# Each target is also judged on its twin where one exists (CPU for wall, wall for CPU: on a shared machine
# wall time includes other people's work, CPU time mostly does not).
TWIN_METRIC = {
    "ms_per_step": "cpu_ms_per_step",
    "first_step_cpu_s": "first_step_wall_s",
    "save_s": "first_save_s",  # the warm save, and the first save of the process (one-off imports included)
    "async_save_s": "async_first_save_s",
}
# Our metric compared with another metric of the baseline: what a save blocks training for with the
# AsyncCheckpointIO plugin, against the reference's (synchronous) save.
BASELINE_METRIC = {"async_save_s": "save_s", "async_first_save_s": "first_save_s"}


def metrics_for(workload: str, runs: list[dict[str, Any]] = ()) -> tuple[str, ...]:
    """The metrics tabled for `workload` (`resume`'s depend on the positions found in `runs`)."""
    if workload == "resume":
        positions = sorted({int(key.rpartition("@")[2]) for run in runs for key in run if "_first_update_s@" in key})
        return (
            tuple(f"{kind}_growth" for kind in RESUME_KINDS)
            + ("iterable_skip_over_draw",)
            + tuple(f"{kind}_first_update_s@{position}" for kind in RESUME_KINDS for position in positions)
            + tuple(f"iterable_draw_s@{position}" for position in positions)
        )
    return {"eval": EVAL_METRICS, "ckpt": CKPT_METRICS, "ddp": DDP_METRICS}.get(workload, TRAIN_METRICS)


def spread(values: list[float]) -> dict[str, float] | None:
    """Median, min and max of the values (None when there are none)."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def _ok(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in results if "error" not in r]


def aggregate(results: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{workload: {runner: {metric: spread}}} over the successful runs."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for result in _ok(results):
        grouped[(result["workload"], result["runner"])].append(result)
    summary: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for (workload, runner), runs in grouped.items():
        summary[workload][runner] = {
            metric: spread([run.get(metric) for run in runs]) for metric in metrics_for(workload, runs)
        }
    return dict(summary)


def paired_ratio(
    results: list[dict[str, Any]],
    workload: str,
    metric: str,
    runner: str,
    baseline: str,
    baseline_metric: str | None = None,
) -> dict[str, float] | None:
    """`runner / baseline` for `metric` (the baseline's `baseline_metric` when given), per repeat, as a spread.

    Baseline `self`: the runner's own value per repeat.
    """
    baseline_metric = baseline_metric or metric
    ours: dict[int, float] = {}
    theirs: dict[int, float] = {}
    for result in _ok(results):
        if result["workload"] != workload:
            continue
        if result["runner"] == runner and result.get(metric) is not None:
            ours[result["repeat"]] = result[metric]
        if result["runner"] == baseline and result.get(baseline_metric) is not None:
            theirs[result["repeat"]] = result[baseline_metric]
    if baseline == SELF:
        return spread(list(ours.values()))
    return spread([ours[r] / theirs[r] for r in ours if r in theirs and theirs[r]])


def ratio_table(results: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """For each workload and metric: our ratio against every other runner of that workload."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    runners_of: dict[str, set[str]] = defaultdict(set)
    for result in _ok(results):
        runners_of[result["workload"]].add(result["runner"])
    for workload, runners in runners_of.items():
        if OURS not in runners:
            continue
        table[workload] = {}
        runs = [r for r in _ok(results) if r["workload"] == workload]
        for metric in metrics_for(workload, runs):
            if metric.startswith("async_"):
                continue  # only hf_lightning has them: their ratios are the targets' (BASELINE_METRIC)
            if metric in ("final_loss", "eval_loss", "cpu_share") or "final_loss" in metric:
                continue
            table[workload][metric] = {
                baseline: paired_ratio(results, workload, metric, OURS, baseline)
                for baseline in sorted(runners - {OURS})
            }
    return table


def _losses(result: dict[str, Any]) -> dict[str, float]:
    """Agreement row name -> loss: the run's `final_loss` / `eval_loss` under its workload's name, and each
    `<name>_final_loss[@position]` of a multi-part workload (ddp, resume) under `workload:<name>[@position]`."""
    losses = {}
    loss = result.get("final_loss", result.get("eval_loss"))
    if loss is not None:
        losses[result["workload"]] = loss
    for key, value in result.items():
        if "_final_loss" in key and value is not None:
            losses[f"{result['workload']}:{key.replace('_final_loss', '')}"] = value
    return losses


def loss_agreement(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every run's loss against the first runner's loss of the same repeat; flags relative gaps > 1e-3."""
    rows = []
    by_key: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    for result in _ok(results):
        for name, loss in _losses(result).items():
            by_key[(name, result["repeat"])][result["runner"]] = loss
    for (workload, repeat), losses in sorted(by_key.items()):
        reference = losses.get("hand", next(iter(losses.values())))
        worst = max(abs(loss - reference) / max(abs(reference), 1e-12) for loss in losses.values())
        rows.append(
            {
                "workload": workload,
                "repeat": repeat,
                "losses": losses,
                "max_rel_diff": worst,
                "agree": worst <= LOSS_RTOL,
            }
        )
    return rows


def step_count_problems(results: list[dict[str, Any]]) -> list[str]:
    """Training runs that did not perform exactly the expected number of optimizer steps."""
    problems = []
    for result in _ok(results):
        if result["workload"] in ("tiny", "cls", "clm") and result.get("steps") != result.get(
            "expected_steps"
        ):
            problems.append(
                f"{result['workload']}/{result['runner']} repeat {result['repeat']}: "
                f"{result.get('steps')} steps, expected {result.get('expected_steps')}"
            )
        for name in ("cls", "clm") if result["workload"] == "ddp" else ():
            if result.get(f"{name}_steps") != result.get(f"{name}_expected_steps"):
                problems.append(
                    f"ddp/{result['runner']} {name} repeat {result['repeat']}: {result.get(f'{name}_steps')} steps, "
                    f"expected {result.get(f'{name}_expected_steps')}"
                )
    return problems


def evaluate_targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target with its measured ratio (median of per-repeat ratios) and met / missed."""

    def status(ratio: dict[str, float] | None, comparison: str, threshold: float) -> str:
        if ratio is None:
            return "n/a"
        within = ratio["median"] <= threshold if comparison == "<=" else ratio["median"] >= threshold
        return "met" if within else "missed"

    rows = []
    for workload, metric, baseline, comparison, threshold in TARGETS:
        ratio = paired_ratio(results, workload, metric, OURS, baseline, BASELINE_METRIC.get(metric))
        twin = TWIN_METRIC.get(metric)
        twin_ratio = (
            paired_ratio(results, workload, twin, OURS, baseline, BASELINE_METRIC.get(twin)) if twin else None
        )
        if baseline == SELF:  # shown next to ours: the reference's own value of the metric
            twin = f"{metric} (transformers)"
            twin_ratio = paired_ratio(results, workload, metric, "transformers", SELF)
        rows.append(
            {
                "workload": workload,
                "metric": metric,
                "baseline": baseline,
                "comparison": comparison,
                "threshold": threshold,
                "ratio": ratio,
                "status": status(ratio, comparison, threshold),
                "twin_metric": twin or "-",
                "twin_ratio": twin_ratio,
                "twin_status": status(twin_ratio, comparison, threshold) if twin and baseline != SELF else "-",
            }
        )
    return rows


# ---- formatting ------------------------------------------------------------------------------------------
def fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def fmt_spread(item: dict[str, float] | None, digits: int = 3) -> str:
    """`median (min-max)`, or just the value for a single run."""
    if item is None:
        return "-"
    if item["n"] == 1 or item["min"] == item["max"]:
        return fmt(item["median"], digits)
    return f"{fmt(item['median'], digits)} ({fmt(item['min'], digits)}-{fmt(item['max'], digits)})"


def markdown_tables(report: dict[str, Any]) -> str:
    """The README tables: per-workload medians, our ratios, loss agreement, targets and import time."""
    lines: list[str] = []
    summary, ratios = report["summary"], report["ratios"]
    for workload, runners in summary.items():
        metrics = list(next(iter(runners.values())))
        repeats = report["repeats"]
        count = repeats.get(workload) if isinstance(repeats, dict) else repeats
        lines.append(f"**{workload}** — median (min-max) over {count} repeat(s)\n")
        lines.append("| runner | " + " | ".join(metrics) + " |")
        lines.append("|---" * (len(metrics) + 1) + "|")
        for runner, values in sorted(runners.items()):
            digits = 6 if workload != "ckpt" else 3
            cells = [
                fmt_spread(values[m], digits if m in ("final_loss", "eval_loss") else 3) for m in metrics
            ]
            lines.append(f"| {runner} | " + " | ".join(cells) + " |")
        if workload in ratios:
            lines.append("")
            baselines = sorted({b for per_metric in ratios[workload].values() for b in per_metric})
            lines.append("| hf_lightning ÷ | " + " | ".join(baselines) + " |")
            lines.append("|---" * (len(baselines) + 1) + "|")
            for metric, per_baseline in ratios[workload].items():
                cells = [fmt_spread(per_baseline.get(b)) for b in baselines]
                lines.append(f"| {metric} | " + " | ".join(cells) + " |")
        lines.append("")
    lines.append("**Targets** (ratio = hf_lightning ÷ baseline, median of per-repeat ratios)\n")
    lines.append(
        "| workload | metric | baseline | target | measured | status | twin metric | twin measured | twin status |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for row in report["targets"]:
        lines.append(
            f"| {row['workload']} | {row['metric']} | {row['baseline']} | {row.get('comparison', '<=')} {row['threshold']} | "
            f"{fmt_spread(row['ratio'])} | **{row['status']}** | {row['twin_metric']} | "
            f"{fmt_spread(row['twin_ratio'])} | {row['twin_status']} |"
        )
    # benchmarks/metric_objects.py runs on its own; its targets join this table ("not measured" without a run).
    from benchmarks.metric_objects import target_rows

    lines.extend(target_rows(report.get("metric_objects")))
    lines.append("")
    disagreements = [row for row in report["loss_agreement"] if not row["agree"]]
    worst = max((row["max_rel_diff"] for row in report["loss_agreement"]), default=0.0)
    lines.append(
        f"Loss agreement: {len(report['loss_agreement']) - len(disagreements)}/{len(report['loss_agreement'])} "
        f"workload-repeats agree within {LOSS_RTOL:g} relative (worst gap {worst:.2g})."
    )
    for problem in report.get("step_count_problems", []):
        lines.append(f"- step count: {problem}")
    imports = report.get("imports")
    if imports:
        lines.append("")
        lines.append(
            "**Import time** (subprocess wall minus `python -c pass`, best of runs; -X importtime total)\n"
        )
        lines.append("| statement | wall s | -X importtime s | transformers imported |")
        lines.append("|---|---|---|---|")
        for row in imports["statements"]:
            lines.append(
                f"| `{row['statement']}` | {fmt(row['wall_s'])} | {fmt(row.get('importtime_s'))} | "
                f"{'yes' if row.get('imports_transformers') else 'no'} |"
            )
    return "\n".join(lines) + "\n"


def build_report(
    results: list[dict[str, Any]], repeats: int | dict[str, int], imports: dict[str, Any] | None
) -> dict[str, Any]:
    """Everything run.py prints and writes to results/latest.json."""
    return {
        "repeats": repeats,
        "summary": aggregate(results),
        "ratios": ratio_table(results),
        "targets": evaluate_targets(results),
        "loss_agreement": loss_agreement(results),
        "step_count_problems": step_count_problems(results),
        "errors": [
            {"workload": r["workload"], "runner": r["runner"], "repeat": r["repeat"], "error": r["error"]}
            for r in results
            if "error" in r
        ],
        "imports": imports,
    }
