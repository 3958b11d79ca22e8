"""One benchmark process: runs the given jobs (normally one) and writes their results as JSON.

Started by run.py as `taskset -c CPU python -m benchmarks.worker --jobs JSON --out FILE`. Imports only
torch and the benchmark modules before the job's runner, which imports its own framework.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from typing import Any

import torch

from benchmarks.timing import StepClock


def _runner(workload: str, runner: str):
    if workload == "eval":
        from benchmarks.eval_runners import EVAL_RUNNERS as runners
    elif workload == "ckpt":
        from benchmarks.ckpt_runners import CKPT_RUNNERS as runners
    elif workload == "ddp":
        from benchmarks.ddp_runners import DDP_RUNNERS as runners
    elif workload == "resume":
        from benchmarks.resume_runners import RESUME_RUNNERS as runners
    else:
        from benchmarks.train_runners import TRAIN_RUNNERS as runners
    if runner not in runners:
        raise ValueError(
            f"runner={runner!r} does not exist for workload {workload!r}; choose from {sorted(runners)}"
        )
    return runners[runner]


def run_job(job: dict[str, Any], scratch_root: str) -> dict[str, Any]:
    """Run one (workload, runner, scale) job; failures are returned as `error` with the traceback."""
    from benchmarks.workloads import build_workload

    result: dict[str, Any] = dict(job)
    output_dir = tempfile.mkdtemp(prefix=f"{job['workload']}-{job['runner']}-", dir=scratch_root)
    clock = StepClock()
    start = time.perf_counter()
    try:
        workload = build_workload(job["workload"], job["scale"], job.get("steps"))
        result.update(_runner(job["workload"], job["runner"])(workload, clock, output_dir))
        result["expected_steps"] = workload.max_steps
    except Exception:
        result["error"] = traceback.format_exc(limit=8)
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)
    result["total_wall_s"] = time.perf_counter() - start
    result.update(clock.summary())
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", required=True, help="JSON list of {workload, runner, scale, repeat}")
    parser.add_argument("--out", required=True, help="where to write the JSON list of results")
    parser.add_argument("--scratch", required=True, help="folder for output_dir / checkpoints")
    options = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    results = [run_job(job, options.scratch) for job in json.loads(options.jobs)]
    with open(options.out, "w") as handle:
        json.dump(results, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
