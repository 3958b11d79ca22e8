"""Benchmark suite: hf_lightning against a hand-written loop, transformers.Trainer and bare Lightning.

    python benchmarks/run.py            # full suite, ~15 minutes on one pinned core
    python benchmarks/run.py --quick    # ~3 minutes, 1 repeat
    python benchmarks/run.py --smoke    # seconds of work at a tiny size; proves the script runs (CI)

Every run is a fresh subprocess pinned with `taskset` to the same core with one thread, and the runners
of a workload are interleaved across repeats (A B C A B C ...). Prints medians (min-max), our ratios
against every runner, loss agreement and the targets; writes benchmarks/results/latest.json, and with
`--readme` the table in benchmarks/README.md. Workloads and runners: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python benchmarks/run.py` puts benchmarks/, not the repo, on the path
    sys.path.insert(0, str(REPO))

from benchmarks import report as reporting  # noqa: E402
from benchmarks.bytecode import compile_tree  # noqa: E402
from benchmarks.import_time import STATEMENTS as IMPORT_STATEMENTS  # noqa: E402
from benchmarks.import_time import measure_imports  # noqa: E402
from benchmarks.timing import SPAWN_ENV  # noqa: E402
from benchmarks.workloads import ALL_WORKLOADS, SCALES  # noqa: E402

RUNNERS = {
    # `hf_lightning_telemetry_off`: the same run with `telemetry=False`, pricing the telemetry (on by default).
    "tiny": ("hand", "transformers", "lightning", "hf_lightning", "hf_lightning_telemetry_off"),
    "cls": ("hand", "transformers", "lightning", "hf_lightning", "hf_lightning_telemetry_off"),
    "clm": ("hand", "transformers", "lightning", "hf_lightning"),
    "eval": ("hand", "transformers", "hf_lightning"),
    "ckpt": ("bare", "transformers", "hf_lightning"),
    "ddp": ("transformers", "hf_lightning"),
    "resume": ("transformers", "hf_lightning"),
}
# Workloads run after the others, one job at a time, so no other job runs beside them. `ddp` jobs use every core of
# the run (2 processes each). A `ckpt` job uses one core, the rest left idle: its saves wait for the disk, and an
# fsync on ext4 commits the journal with the dirty data of every file written meanwhile, a neighbour job's
# included, so a neighbour's writes (another ckpt job's 45 MB checkpoint) would be timed as part of our save.
EXCLUSIVE_WORKLOADS = {"ckpt": "one", "ddp": "all"}
README = REPO / "benchmarks" / "README.md"
TABLE_START, TABLE_END = "<!-- results:start -->", "<!-- results:end -->"


def workload_repeats(workload: str, scale: str, override: int | None = None) -> int:
    """Repeats of `workload`: `--repeats`, else the scale's `<workload>_repeats`, else its `repeats`."""
    settings = SCALES[scale]
    return override or settings.get(f"{workload}_repeats", settings["repeats"])


def plan_jobs(
    workloads: Iterable[str], scale: str, repeats: int | None = None, only: Iterable[str] | None = None
) -> list[dict[str, Any]]:
    """All jobs in run order: per workload, the runners (those in `only` when given) interleaved across repeats.

    The runner order rotates by one each repeat, so with two cores no runner always shares the machine
    with the same neighbour (the ratios of one repeat come from runs close in time either way).
    """
    jobs = []
    for workload in workloads:
        runners = [runner for runner in RUNNERS[workload] if only is None or runner in only]
        for repeat in range(workload_repeats(workload, scale, repeats)):
            shift = repeat % len(runners)
            for runner in runners[shift:] + runners[:shift]:
                jobs.append({"workload": workload, "runner": runner, "scale": scale, "repeat": repeat})
    return jobs


# Smoke runs group runners that import the same frameworks into one process each, to pay imports once.
SMOKE_PROCESSES = (("hand", "bare", "transformers"), ("lightning", "hf_lightning", "hf_lightning_telemetry_off"))


def group_jobs(jobs: list[dict[str, Any]], smoke: bool) -> list[list[dict[str, Any]]]:
    """One job per process; in smoke mode, one process per SMOKE_PROCESSES family (timings meaningless)."""
    if not smoke:
        return [[job] for job in jobs]
    groups = [[job for job in jobs if job["runner"] in family] for family in SMOKE_PROCESSES]
    return [group for group in groups if group]


def worker_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
    )
    return env


def run_group(
    jobs: list[dict[str, Any]], cpu: str | None, threads: int, scratch: str
) -> list[dict[str, Any]]:
    """Run jobs in one fresh pinned worker process; a crash becomes an `error` result per job."""
    out = tempfile.mktemp(suffix=".json", dir=scratch)
    log = out.replace(".json", ".log")
    prefix = ["taskset", "-c", cpu] if cpu else []
    command = [*prefix, sys.executable, "-m", "benchmarks.worker", "--jobs", json.dumps(jobs)]
    command += ["--out", out, "--scratch", scratch]
    env = worker_env(threads)
    env[SPAWN_ENV] = repr(time.monotonic())
    with open(log, "w") as handle:
        completed = subprocess.run(command, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)
    if completed.returncode == 0 and os.path.exists(out):
        with open(out) as handle:
            return json.load(handle)
    tail = Path(log).read_text()[-3000:]
    return [{**job, "error": f"worker exited {completed.returncode}:\n{tail}"} for job in jobs]


def describe(result: dict[str, Any]) -> str:
    head = f"{result['workload']:>5} {result['runner']:<13} r{result['repeat']}"
    if "error" in result:
        return f"{head} ERROR {result['error'].strip().splitlines()[-1]}"
    if result["workload"] == "eval":
        return (
            f"{head} evaluate {result['evaluate_samples_per_s']:.1f}/s  predict {result['predict_samples_per_s']:.1f}/s"
            f"  loss {result['eval_loss']:.6f}"
        )
    if result["workload"] == "ddp":
        return (
            f"{head} cls {result['cls_steps_per_s']:.3f} steps/s  clm {result['clm_steps_per_s']:.3f} steps/s  "
            f"loss {result['cls_final_loss']:.6f} / {result['clm_final_loss']:.6f}"
        )
    if result["workload"] == "resume":
        return f"{head} " + "  ".join(
            f"{key} {value:.3f}" for key, value in result.items() if "_first_update_s@" in key or key.endswith("_growth")
        )
    if result["workload"] == "ckpt":
        resume = result.get("resume_load_s")
        resume_text = f"{resume:.3f}s" if resume is not None else result.get("resume_error", "-")[:60]
        return (
            f"{head} first save {result['first_save_s']:.3f}s  save {result['save_s']:.3f}s "
            f"(fsync {result['fsync_s']:.3f}s)  resume-load {resume_text}"
        )
    return (
        f"{head} {result['ms_per_step']:.3f} ms/step (cpu {result['cpu_ms_per_step']:.3f})  "
        f"first step {result['first_step_wall_s']:.2f}s wall / {result['first_step_cpu_s']:.2f}s cpu  "
        f"rss {result['peak_rss_mb']:.0f} MiB  cpu share {result['cpu_share']:.2f}  loss {result['final_loss']:.6f}"
    )


def _repeats_text(repeats: int | dict[str, int]) -> str:
    if isinstance(repeats, int):
        return f"{repeats} repeat(s)"
    return "repeats " + ", ".join(f"{workload} {count}" for workload, count in repeats.items())


def run_suite(options: argparse.Namespace) -> dict[str, Any]:
    scale = "smoke" if options.smoke else "quick" if options.quick else "full"
    workloads = options.workloads.split(",") if options.workloads else list(ALL_WORKLOADS)
    unknown = sorted(set(workloads) - set(ALL_WORKLOADS))
    if unknown:
        raise SystemExit(f"--workloads: unknown {unknown}; choose from {', '.join(ALL_WORKLOADS)}")
    repeats = {workload: workload_repeats(workload, scale, options.repeats) for workload in workloads}
    cpus = options.cpus.split(",") if options.cpus else [None]
    only = options.runners.split(",") if options.runners else None
    known = {runner for workload in workloads for runner in RUNNERS[workload]}
    if only is not None and not set(only) <= known:
        raise SystemExit(f"--runners: {sorted(set(only) - known)} run none of {workloads}; choose from {sorted(known)}")
    jobs = plan_jobs(workloads, scale, options.repeats, only)
    groups = group_jobs(jobs, smoke=options.smoke)
    compile_tree(REPO)  # every timed process reads the bytecode, as from an installed copy
    scratch_root = REPO / "benchmarks" / ".scratch"
    scratch_root.mkdir(exist_ok=True)
    scratch = tempfile.mkdtemp(dir=scratch_root)  # on disk, not tmpfs: fsync costs what it costs
    print(f"scale={scale} repeats={repeats} jobs={len(jobs)} processes={len(groups)} cpus={options.cpus}")
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    try:
        # Each process takes a free core and gives it back: two runners never share a pinned core.
        free_cpus: queue.Queue = queue.Queue()
        for cpu in cpus:
            free_cpus.put(cpu)

        def run_on_free_cpu(group: list[dict[str, Any]]) -> list[dict[str, Any]]:
            cpu = free_cpus.get()
            try:
                return run_group(group, cpu, options.threads, scratch)
            finally:
                free_cpus.put(cpu)

        exclusive = [] if options.smoke else [g for g in groups if g[0]["workload"] in EXCLUSIVE_WORKLOADS]
        shared = [group for group in groups if group not in exclusive]
        with ThreadPoolExecutor(max_workers=min(options.parallel, len(cpus))) as pool:
            futures = [pool.submit(run_on_free_cpu, group) for group in shared]
            for future in futures:
                for result in future.result():
                    results.append(result)
                    print(f"[{len(results)}/{len(jobs)}] {describe(result)}", flush=True)
        all_cpus = ",".join(cpu for cpu in cpus if cpu) or None
        for group in exclusive:
            cores = all_cpus if EXCLUSIVE_WORKLOADS[group[0]["workload"]] == "all" else cpus[0]
            for result in run_group(group, cores, options.threads, scratch):
                results.append(result)
                print(f"[{len(results)}/{len(jobs)}] {describe(result)}", flush=True)
        imports = None
        if not options.no_imports:
            prefix = ["taskset", "-c", cpus[0]] if cpus[0] else []
            statements = IMPORT_STATEMENTS[:1] if options.smoke else IMPORT_STATEMENTS
            imports = measure_imports(
                prefix, worker_env(options.threads), statements, runs=3 if scale == "full" else 1
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report = reporting.build_report(results, repeats, imports)
    report.update(
        scale=scale,
        cpus=options.cpus,
        machine_cores=os.cpu_count(),
        threads=options.threads,
        elapsed_s=time.perf_counter() - started,
        date=time.strftime("%Y-%m-%d %H:%M"),
        results=results,
    )
    return report


def update_readme(markdown: str, header: str) -> None:
    """Replace the table between the README's result markers."""
    text = README.read_text()
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    README.write_text(text[:start] + "\n" + header + "\n\n" + markdown + text[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="fewer steps, 1 repeat (~3 minutes)")
    size.add_argument("--smoke", action="store_true", help="tiny sizes, 1 repeat, runners grouped (CI check)")
    parser.add_argument("--workloads", help=f"comma-separated subset of {','.join(ALL_WORKLOADS)}")
    parser.add_argument("--repeats", type=int, help="override the scale's repeat count")
    parser.add_argument(
        "--runners", help="comma-separated subset of the runners (e.g. hf_lightning,hf_lightning_telemetry_off)"
    )
    parser.add_argument(
        "--cpus", help="taskset core list, one per parallel process (default: 0,1; smoke: unpinned)"
    )
    parser.add_argument("--threads", type=int, default=1, help="OMP/MKL/torch threads per runner (default 1)")
    parser.add_argument("--parallel", type=int, help="processes at once, one per core (default 2)")
    parser.add_argument("--no-imports", action="store_true", help="skip the import-time measurement")
    parser.add_argument(
        "--out", default=str(REPO / "benchmarks" / "results" / "latest.json"), help="JSON output"
    )
    parser.add_argument("--readme", action="store_true", help="write the tables into benchmarks/README.md")
    parser.add_argument(
        "--from-json", help="re-render a saved report (no runs); with --readme, update the README"
    )
    options = parser.parse_args(argv)
    if options.from_json:
        return render_saved(Path(options.from_json), Path(options.out), options.readme)
    cores = os.cpu_count() or 1
    if options.parallel is None:
        # One runner per core (2 on the reference machine): the full suite stays under 10 minutes.
        options.parallel = 2 if options.smoke else min(2, cores)
    if options.cpus is None:
        # Smoke timings mean nothing: leave its two processes to the scheduler.
        options.cpus = "" if options.smoke else ",".join(str(core) for core in range(options.parallel))
    if shutil.which("taskset") is None:
        print("taskset not found: runners are not pinned", file=sys.stderr)
        options.cpus = ""

    report = run_suite(options)
    return publish(report, Path(options.out), options.readme)


def publish(report: dict[str, Any], out: Path, readme: bool) -> int:
    """Print the tables, write the JSON (and the README); non-zero when a run failed or disagreed."""
    saved = REPO / "benchmarks" / "results" / "metric_objects.json"
    if "metric_objects" not in report and saved.exists():
        # The metric-object benchmark's last run (benchmarks/metric_objects.py), shown in the targets table.
        report["metric_objects"] = json.loads(saved.read_text())["summary"]
    markdown = reporting.markdown_tables(report)
    print()
    print(markdown)
    for error in report["errors"]:
        print(
            f"ERROR {error['workload']}/{error['runner']} r{error['repeat']}:\n{error['error']}",
            file=sys.stderr,
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out} ({report['elapsed_s']:.0f} s)")
    if readme:
        header = (
            f"Measured {report['date']}, scale `{report['scale']}`, {_repeats_text(report['repeats'])}, "
            f"on a {report.get('machine_cores', '?')}-core machine, cores `{report['cpus']}`, "
            f"{report['threads']} thread(s); {report['elapsed_s']:.0f} s in all."
        )
        update_readme(markdown, header)
    failed = bool(report["errors"] or report["step_count_problems"])
    failed |= not all(row["agree"] for row in report["loss_agreement"])
    return 1 if failed else 0


def render_saved(path: Path, out: Path, readme: bool) -> int:
    """Rebuild the report of a saved run from its raw results (e.g. after changing the tables)."""
    saved = json.loads(path.read_text())
    report = reporting.build_report(saved["results"], saved["repeats"], saved["imports"])
    report.update({key: saved[key] for key in ("scale", "cpus", "threads", "elapsed_s", "date", "results")})
    report["machine_cores"] = saved.get("machine_cores", os.cpu_count())  # runs saved before it was recorded
    return publish(report, out, readme)


if __name__ == "__main__":
    sys.exit(main())
