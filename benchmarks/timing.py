"""Clocks shared by every runner: time since the process was spawned, per-step intervals, peak RSS.

The parent passes its `time.monotonic()` at spawn in `BENCH_SPAWN_MONOTONIC`; CLOCK_MONOTONIC is
system-wide on Linux, so the child can measure wall time from before its interpreter started.
`time.process_time()` counts the process's CPU time from its start (interpreter and imports included).
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from typing import Any

SPAWN_ENV = "BENCH_SPAWN_MONOTONIC"


def since_spawn() -> float:
    """Wall seconds since the parent spawned this process (since now if it was not spawned by run.py)."""
    spawned = float(os.environ.get(SPAWN_ENV, time.monotonic()))
    return time.monotonic() - spawned


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class StepClock:
    """Records wall and CPU time at the end of each optimizer step (called from a hook or callback)."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.first_step_wall_s: float | None = None
        self.first_step_cpu_s: float | None = None
        self.imports_wall_s: float | None = None
        self.imports_cpu_s: float | None = None

    def imports_done(self) -> None:
        """Mark the end of the runner's framework imports (part of the start-up)."""
        self.imports_wall_s = since_spawn()
        self.imports_cpu_s = time.process_time()

    def tick(self) -> None:
        self.wall.append(time.perf_counter())
        self.cpu.append(time.process_time())
        if self.first_step_wall_s is None:
            self.first_step_wall_s = since_spawn()
            self.first_step_cpu_s = self.cpu[-1]

    def summary(self) -> dict[str, Any]:
        """Start-up, steady-state ms per step (median of intervals after warm-up) and the step count."""
        steps = len(self.wall)
        warmup = warmup_intervals(steps)
        wall_intervals = _intervals(self.wall)[warmup:]
        cpu_intervals = _intervals(self.cpu)[warmup:]
        return {
            "steps": steps,
            "warmup_intervals": warmup,
            "imports_wall_s": self.imports_wall_s,
            "imports_cpu_s": self.imports_cpu_s,
            "first_step_wall_s": self.first_step_wall_s,
            "first_step_cpu_s": self.first_step_cpu_s,
            "ms_per_step": 1000 * statistics.median(wall_intervals) if wall_intervals else None,
            "mean_ms_per_step": 1000 * statistics.fmean(wall_intervals) if wall_intervals else None,
            "cpu_ms_per_step": 1000 * statistics.median(cpu_intervals) if cpu_intervals else None,
            # The mean keeps what a few steps pay for the others (a copy at each log), which the median leaves out.
            "mean_cpu_ms_per_step": 1000 * statistics.fmean(cpu_intervals) if cpu_intervals else None,
            # CPU / wall over the steady state: well below 1 means the core was shared during the run.
            "cpu_share": sum(cpu_intervals) / sum(wall_intervals) if wall_intervals else None,
            "peak_rss_mb": peak_rss_mb(),
        }


def warmup_intervals(steps: int) -> int:
    """Intervals skipped as warm-up: a tenth of the run, at least 2 (fewer when the run is shorter)."""
    return min(max(2, steps // 10), max(0, steps - 2))


def _intervals(stamps: list[float]) -> list[float]:
    return [later - earlier for earlier, later in zip(stamps, stamps[1:])]
