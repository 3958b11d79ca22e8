"""What the run guard costs a training step when nothing goes wrong, on the `tiny` and `cls` workloads.

    python benchmarks/run_guard_cost.py                   # tiny and cls, full scale, 5 / 3 interleaved pairs
    python benchmarks/run_guard_cost.py --pairs 3 --workloads tiny --scale smoke

One process, one thread, pinned by the caller if wanted (`taskset -c 1 ...`). Per workload and action (`rollback`,
which decides at training logs like `stop`, and `skip`, which decides there too and keeps a CPU copy of the run's
state at each of them), the run with
`RunGuard(action, grad_norm=True)` over the same run without it, by steady-state CPU ms per step (the median step,
and the mean, which also carries what the log steps pay for the others), per pair of back-to-back runs in this
process (the order alternates): median (min-max) of the pairs' ratios. The target is a ratio within 1%.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from benchmarks.timing import StepClock  # noqa: E402
from benchmarks.workloads import build_workload, stack_collate  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "run_guard_cost.json"
ACTIONS = ("rollback", "skip")


def _run(workload: Any, action: str | None) -> tuple[float, float]:
    """Steady-state CPU ms per step of one run (median step, mean), with the guard (`action`) or without it (None)."""
    from hf_lightning import RunGuard, Trainer, TrainerCallback, TrainingArguments

    clock = StepClock()

    class StepEnd(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            clock.tick()

    callbacks: list[Any] = [StepEnd()]
    if action is not None:
        callbacks.append(RunGuard(action, grad_norm=True, rtol=1e9))  # every update judged at the logs, no event
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = Trainer(
            model=workload.seeded_model(),
            args=TrainingArguments(**workload.trainer_args(output_dir)),
            train_dataset=workload.train_dataset(),
            data_collator=stack_collate,
            callbacks=callbacks,
        )
        trainer.train()
    summary = clock.summary()
    return summary["cpu_ms_per_step"], summary["mean_cpu_ms_per_step"]


def measure(name: str, pairs: int, scale: str) -> dict[str, Any]:
    workload = build_workload(name, scale)
    _run(workload, None)  # warm-up
    result: dict[str, Any] = {"workload": name, "steps": workload.max_steps}
    for action in ACTIONS:
        ratios, mean_ratios, off_ms = [], [], []
        for pair in range(pairs):
            order = (action, None) if pair % 2 == 0 else (None, action)
            times = {side: _run(workload, side) for side in order}
            ratios.append(times[action][0] / times[None][0])
            mean_ratios.append(times[action][1] / times[None][1])
            off_ms.append(times[None][0])
        result[action] = {
            "pair_ratio": statistics.median(ratios),
            "pair_ratio_min": min(ratios),
            "pair_ratio_max": max(ratios),
            "mean_pair_ratio": statistics.median(mean_ratios),
            "mean_pair_ratio_min": min(mean_ratios),
            "mean_pair_ratio_max": max(mean_ratios),
            "off_cpu_ms_per_step": statistics.median(off_ms),
        }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="tiny,cls")
    parser.add_argument("--pairs", type=int, default=None, help="pairs per action (default 5 tiny, 3 otherwise)")
    parser.add_argument("--scale", default="full")
    parser.add_argument("--out", type=Path, default=OUT)
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for name in options.workloads.split(","):
        pairs = options.pairs or (5 if name == "tiny" else 3)
        result = measure(name, pairs, options.scale)
        results.append(result)
        for action in ACTIONS:
            figures = result[action]
            print(
                f"{name} {action}: on/off median step {figures['pair_ratio']:.3f} ({figures['pair_ratio_min']:.3f}-"
                f"{figures['pair_ratio_max']:.3f}), mean step {figures['mean_pair_ratio']:.3f} "
                f"({figures['mean_pair_ratio_min']:.3f}-{figures['mean_pair_ratio_max']:.3f}), "
                f"off {figures['off_cpu_ms_per_step']:.2f} ms/step"
            )
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({"scale": options.scale, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
