"""Why a CPU step pays for freeing its gradients: minor page faults and CPU ms per step, by where they are freed.

    python benchmarks/gradient_memory.py --repeats 3      # the cls BERT, one thread, one process per run

The reference's loop written by hand on the suite's `cls` workload, in three variants run in fresh processes, the
variants interleaved: `freed` (the reference: `model.zero_grad()` after the update), `held` (the same call, the old
gradient tensors kept until the next backward: engine/held_gradients.py) and `zeroed_before_backward` (Lightning's
own order: `zero_grad()` between forward and backward). Each process reports the median over its steps after two
warm-up steps of CPU ms and of `ru_minflt` (minor page faults: pages the OS had to map and zero again).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

VARIANTS = ("freed", "held", "zeroed_before_backward")
WARM_UP = 2


def measure(variant: str, steps: int) -> dict[str, float]:
    """One process's run of `variant`: the median CPU ms and minor page faults per step after the warm-up."""
    import torch

    from benchmarks.train_runners import (
        MAX_GRAD_NORM,
        EpochSeededSampler,
        _window_count,
        linear_schedule,
        reference_optimizer,
        training_loader,
    )
    from benchmarks.workloads import build_workload

    torch.set_num_threads(1)
    workload = build_workload("cls", "quick", steps)
    model = workload.seeded_model()
    model.train()
    dataset = workload.train_dataset()
    batches = iter(training_loader(workload, dataset, EpochSeededSampler(len(dataset))))
    optimizer = reference_optimizer(model, workload.learning_rate)
    scheduler = linear_schedule(optimizer, workload.max_steps)
    held: list = []
    cpu_ms, faults = [], []
    for _ in range(workload.max_steps):
        batch = next(batches)
        faults_before, cpu_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
        loss = model(**batch, num_items_in_batch=_window_count(workload, [batch]))["loss"]
        if variant == "zeroed_before_backward":
            model.zero_grad()
        held = []  # `held`: the previous update's gradients go just before this backward
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        scheduler.step()
        if variant == "held":
            held = [parameter.grad for parameter in model.parameters()]
        if variant != "zeroed_before_backward":
            model.zero_grad()
        cpu_ms.append(1000 * (time.process_time() - cpu_before))
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before)
    del held
    return {
        "cpu_ms_per_step": statistics.median(cpu_ms[WARM_UP:]),
        "minor_faults_per_step": statistics.median(faults[WARM_UP:]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # one worker process
    parser.add_argument("--out", help="also write the figures as JSON here")
    options = parser.parse_args(argv)
    if options.variant:
        print(json.dumps(measure(options.variant, options.steps)))
        return 0
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    runs: dict[str, list[dict[str, float]]] = {variant: [] for variant in VARIANTS}
    for _ in range(options.repeats):
        for variant in VARIANTS:
            command = [sys.executable, __file__, "--variant", variant, "--steps", str(options.steps)]
            output = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
            runs[variant].append(json.loads(output.strip().splitlines()[-1]))
    summary = {}
    for variant, results in runs.items():
        summary[variant] = {key: statistics.median(result[key] for result in results) for key in results[0]}
        figures = summary[variant]
        print(f"{variant:>24}: {figures['cpu_ms_per_step']:.1f} CPU ms/step, "
              f"{figures['minor_faults_per_step']:.0f} minor page faults/step (median of {options.repeats})")
    held_over_freed = [held["cpu_ms_per_step"] / freed["cpu_ms_per_step"]
                       for held, freed in zip(runs["held"], runs["freed"])]
    print(f"held / freed CPU ms per step: {statistics.median(held_over_freed):.3f} "
          f"(per repeat {', '.join(f'{ratio:.3f}' for ratio in held_over_freed)})")
    if options.out:
        Path(options.out).write_text(json.dumps({"runs": runs, "summary": summary,
                                                 "held_over_freed": held_over_freed}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
