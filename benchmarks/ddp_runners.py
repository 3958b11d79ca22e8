"""The `ddp` workload: the `cls` and `clm` runs on 2 processes (gloo, CPU), ours against transformers.Trainer.

Each runner launches `torch.distributed.run --nproc_per_node=2` on this file, which trains `cls` then `clm` with
the workload's arguments plus `ddp_backend="gloo"` and `use_cpu=True` (the same per-device batch, so the global
batch is twice the single-process one), and writes rank 0's numbers as JSON:

- `<name>_steps_per_s`: 1 / the median interval between optimizer-step ends after a tenth of the run as warm-up
  (all intervals when the run is shorter), recorded by an `on_step_end` callback on rank 0;
- `<name>_final_loss`: rank 0's probe loss of the trained model, the agreement check;
- `<name>_steps`: optimizer steps made (must equal the planned `max_steps`).

`python benchmarks/run.py --workloads ddp` runs it after the other workloads, alone on the run's cores.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # run by torch.distributed.run as a script
    sys.path.insert(0, REPO)

from benchmarks.timing import StepClock, warmup_intervals  # noqa: E402
from benchmarks.workloads import Workload  # noqa: E402

DDP_WORKLOADS = ("cls", "clm")
LAUNCH_TIMEOUT_S = 900


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(runner: str, workload: Workload, output_dir: str) -> dict[str, Any]:
    """Run `runner` ("transformers" or "hf_lightning") on 2 processes; rank 0's numbers."""
    out = os.path.join(output_dir, f"ddp-{runner}.json")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}", os.path.abspath(__file__), runner, workload.extra["scale"],
        str(workload.max_steps), out, output_dir,
    ]
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    if completed.returncode != 0:
        raise RuntimeError(f"the 2-process {runner} run exited {completed.returncode}:\n{completed.stderr[-3000:]}")
    with open(out) as handle:
        return json.load(handle)


def steady_steps_per_s(stamps: list[float]) -> float | None:
    """1 / median interval between step ends after the warm-up (None with fewer than 2 steps)."""
    intervals = [later - earlier for earlier, later in zip(stamps, stamps[1:])]
    steady = intervals[warmup_intervals(len(stamps)) :] or intervals
    return 1.0 / statistics.median(steady) if steady else None


def _train_one(runner: str, name: str, scale: str, steps: int, output_dir: str) -> dict[str, Any]:
    from benchmarks.workloads import build_workload, probe_loss

    if runner == "transformers":
        from transformers import Trainer, TrainerCallback, TrainingArguments
    else:
        from hf_lightning import Trainer, TrainerCallback, TrainingArguments
    workload = build_workload(name, scale, steps=steps)
    stamps: list[float] = []

    class StepEnds(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    args = {**workload.trainer_args(os.path.join(output_dir, f"{runner}-{name}")), "ddp_backend": "gloo"}
    trainer = Trainer(
        model=workload.seeded_model(),
        args=TrainingArguments(use_cpu=True, **args),
        train_dataset=workload.train_dataset(),
        callbacks=[StepEnds()],
    )
    trainer.train()
    return {
        f"{name}_steps_per_s": steady_steps_per_s(stamps),
        f"{name}_final_loss": probe_loss(trainer.model, workload),
        f"{name}_steps": len(stamps),
        f"{name}_expected_steps": workload.max_steps,
    }


def rank_main(runner: str, scale: str, steps: int, out: str, output_dir: str) -> None:
    """One rank of the 2-process run: train every DDP workload, rank 0 writes the results."""
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    results: dict[str, Any] = {}
    for name in DDP_WORKLOADS:
        results.update(_train_one(runner, name, scale, steps, output_dir))
    if int(os.environ.get("RANK", "0")) == 0:
        with open(out, "w") as handle:
            json.dump(results, handle)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _ddp_runner(runner: str) -> Callable[[Workload, StepClock, str], dict[str, Any]]:
    def run(workload: Workload, clock: StepClock, output_dir: str) -> dict[str, Any]:
        clock.imports_done()
        return launch(runner, workload, output_dir)  # `<name>_final_loss`: agreement rows `ddp:<name>`

    return run


DDP_RUNNERS: dict[str, Callable[[Workload, StepClock, str], dict[str, Any]]] = {
    "transformers": _ddp_runner("transformers"),
    "hf_lightning": _ddp_runner("hf_lightning"),
}


if __name__ == "__main__":
    rank_main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
