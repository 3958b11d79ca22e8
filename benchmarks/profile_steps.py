"""Where a runner's steady-state step time goes: cProfile over the steps after warm-up, by package.

    python benchmarks/profile_steps.py --runner hf_lightning --workload tiny
    python benchmarks/profile_steps.py --runner transformers --workload tiny --top 30

The profiler is switched on at the end of step `warm-up` and off at the last step, so start-up and
finalisation are excluded. cProfile inflates Python call overhead roughly evenly, so compare the
shares between runners rather than the absolute milliseconds.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from benchmarks.timing import StepClock, warmup_intervals  # noqa: E402
from benchmarks.train_runners import TRAIN_RUNNERS  # noqa: E402
from benchmarks.workloads import build_workload  # noqa: E402

_PACKAGES = (
    "hf_lightning",
    "lightning_utilities",
    "lightning",
    "transformers",
    "accelerate",
    "torch",
    "benchmarks",
)


def package_of(filename: str) -> str:
    """The top-level package a profiled function belongs to (`builtins` for C functions)."""
    if filename == "~" or filename.startswith("<"):
        return "builtins/C"
    for package in _PACKAGES:
        if f"{os.sep}{package}{os.sep}" in filename:
            return package
    return "python stdlib/other"


class ProfilingClock(StepClock):
    """A StepClock that profiles the steps between the end of warm-up and the last step."""

    def __init__(self, start_at: int, stop_at: int) -> None:
        super().__init__()
        self.profiler = cProfile.Profile()
        self.start_at, self.stop_at = start_at, stop_at
        self.profiled_steps = 0

    def tick(self) -> None:
        super().tick()
        steps = len(self.wall)
        if steps == self.start_at:
            self.profiler.enable()
        elif steps == self.stop_at:
            self.profiler.disable()
            self.profiled_steps = self.stop_at - self.start_at


def profile_runner(
    runner: str, workload_name: str, scale: str, steps: int | None
) -> tuple[pstats.Stats, int]:
    workload = build_workload(workload_name, scale, steps)
    clock = ProfilingClock(start_at=warmup_intervals(workload.max_steps) + 1, stop_at=workload.max_steps)
    with tempfile.TemporaryDirectory() as output_dir:
        TRAIN_RUNNERS[runner](workload, clock, output_dir)
    return pstats.Stats(clock.profiler), clock.profiled_steps


def by_package(stats: pstats.Stats, steps: int) -> dict[str, float]:
    """Own time (ms per step) by package."""
    totals: dict[str, float] = defaultdict(float)
    for (filename, _, _), (_, _, tottime, _, _) in stats.stats.items():
        totals[package_of(filename)] += tottime
    return {k: 1000 * v / steps for k, v in sorted(totals.items(), key=lambda item: -item[1])}


def top_functions(
    stats: pstats.Stats, steps: int, key: int, packages: tuple[str, ...], top: int
) -> list[Any]:
    """The `top` functions of `packages` by own time (key=2) or cumulative time (key=3), ms per step."""
    rows = []
    for (filename, line, name), values in stats.stats.items():
        if package_of(filename) in packages:
            short = filename.split(f"site-packages{os.sep}")[-1].split(f"{REPO}{os.sep}")[-1]
            rows.append((1000 * values[key] / steps, values[1] / steps, f"{short}:{line} {name}"))
    return sorted(rows, reverse=True)[:top]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runner", default="hf_lightning", choices=sorted(TRAIN_RUNNERS))
    parser.add_argument("--workload", default="tiny", choices=("tiny", "cls", "clm"))
    parser.add_argument("--scale", default="quick", choices=("full", "quick", "smoke"))
    parser.add_argument("--steps", type=int)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--save", help="write the raw pstats file here (for snakeviz etc.)")
    options = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    stats, steps = profile_runner(options.runner, options.workload, options.scale, options.steps)
    if options.save:
        stats.dump_stats(options.save)
    total = sum(by_package(stats, steps).values())
    print(
        f"{options.runner} / {options.workload}: {steps} profiled steps, {total:.3f} ms/step under cProfile"
    )
    print("own time by package (ms/step):")
    for package, ms in by_package(stats, steps).items():
        print(f"  {ms:8.3f}  {package}")
    frameworks = ("hf_lightning", "lightning", "lightning_utilities", "transformers", "accelerate")
    print(f"top {options.top} framework functions by cumulative time (ms/step, calls/step):")
    for ms, calls, where in top_functions(stats, steps, 3, frameworks, options.top):
        print(f"  {ms:8.3f}  {calls:6.1f}  {where}")
    print(f"top {options.top} functions by own time (ms/step, calls/step):")
    for ms, calls, where in top_functions(
        stats, steps, 2, (*frameworks, "torch", "python stdlib/other", "builtins/C"), options.top
    ):
        print(f"  {ms:8.3f}  {calls:6.1f}  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
