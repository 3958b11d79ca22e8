"""What the telemetry (on by default) costs a training step, on the `tiny` and `cls` workloads.

    python benchmarks/telemetry_cost.py                  # tiny and cls, full scale, 6 / 3 interleaved pairs
    python benchmarks/telemetry_cost.py --pairs 4 --workloads tiny

One process, one thread, pinned by the caller if wanted (`taskset -c 1 ...`). Three figures per workload:

- `step_work_us`: the telemetry's own work on a step that does not log, timed on its real parts with the workload's
  real batch: the batch counter, the data clock around the batch draw (one more call frame) and the optimizer clock
  (min of 7 timings of 20,000 steps, less the same loop doing nothing);
- `window_us_per_step`: what closing the logging windows (the device reads, the figures, the loggers) costs in a
  real run, timed around the meter's method and spread over the run's steps; one-offs beside it: `flops_ms`, the
  FLOP measurement on the meta device at the first micro-batch, and `run_end_ms`, the summary at the end of
  `train()` (figures, the printed lines; run_performance.json only with `summary_file=True`);
- `pair_ratio`: the run with the telemetry over the same run with `telemetry=False`, by steady-state CPU ms per step,
  per pair of back-to-back runs in this process (the order alternates), median (min-max).

`cost_share` = (step_work_us + window_us_per_step) / the off run's step time: the telemetry's share of a step,
free of the neighbours' load that moves a shared machine's end-to-end ratios by several per cent. The benchmark
runner pair `hf_lightning` / `hf_lightning_telemetry_off` in `benchmarks/run.py` gives the end-to-end figure across
processes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from benchmarks.timing import StepClock  # noqa: E402
from benchmarks.workloads import build_workload, stack_collate  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "telemetry_cost.json"


def _loop_seconds(body, steps: int, repeats: int = 7) -> float:
    """Min over `repeats` of the seconds `steps` calls of `body` take."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(steps):
            body()
        best = min(best, time.perf_counter() - started)
    return best


def step_work_us(batch: dict[str, torch.Tensor], steps: int = 20_000) -> float:
    """Microseconds the telemetry adds to a step that does not log (its real parts, the workload's batch)."""
    from hf_lightning.engine.telemetry.clocks import HostClock
    from hf_lightning.engine.telemetry.counting import BatchCounter

    counter = BatchCounter("input_ids", None)
    data_clock, optimizer_clock = HostClock(), HostClock()
    batches = iter(())

    def draw() -> Any:  # the timed iterator's extra frame around the draw
        data_clock.start()
        try:
            return next(batches, batch)
        finally:
            data_clock.stop()

    def with_telemetry() -> None:
        inputs = draw()
        if counter is not None:
            counter.count(inputs)
        optimizer_clock.start()
        optimizer_clock.stop()

    def without() -> None:
        next(batches, batch)

    with_seconds = _loop_seconds(with_telemetry, steps)
    counter.take()  # the window's read, so the device total does not grow without bound between timings
    return max(with_seconds - _loop_seconds(without, steps), 0.0) / steps * 1e6


def _run(workload, telemetry: bool, timed: dict[str, float] | None = None) -> dict[str, Any]:
    """One training run of `workload`; with `timed`, the seconds spent in the meter's window and run methods."""
    from hf_lightning import Trainer, TrainerCallback, TrainingArguments

    clock = StepClock()

    class StepEnd(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            clock.tick()

    with tempfile.TemporaryDirectory() as output_dir:
        trainer = Trainer(
            model=workload.seeded_model(),
            args=TrainingArguments(**workload.trainer_args(output_dir)),
            train_dataset=workload.train_dataset(),
            data_collator=stack_collate,
            callbacks=[StepEnd()],
            telemetry=telemetry,
        )
        if timed is not None:
            meter = trainer._telemetry
            for name in ("close_window", "finish_training"):
                method = getattr(meter, name)

                def wrapped(*args, _method=method, _name=name, **kwargs):
                    started = time.perf_counter()
                    try:
                        return _method(*args, **kwargs)
                    finally:
                        timed[_name] = timed.get(_name, 0.0) + time.perf_counter() - started

                setattr(meter, name, wrapped)
        trainer.train()
    return clock.summary()


def measure(name: str, pairs: int, scale: str) -> dict[str, Any]:
    """The three figures of one workload (module docstring)."""
    from hf_lightning.engine.telemetry.flops import measure_micro_batch_flops

    workload = build_workload(name, scale)
    dataset = workload.train_dataset()
    batch = stack_collate([dataset[i] for i in range(workload.batch_size)])
    work = step_work_us(batch, steps=20_000 if name == "tiny" else 2_000)
    started = time.perf_counter()
    measure_micro_batch_flops(workload.seeded_model(), batch)
    flops_ms = (time.perf_counter() - started) * 1000
    timed: dict[str, float] = {}
    _run(workload, telemetry=True, timed=timed)  # warm-up, and the window methods' time
    window_us = timed["close_window"] / workload.max_steps * 1e6
    ratios, off_ms = [], []
    for pair in range(pairs):
        order = (True, False) if pair % 2 == 0 else (False, True)
        runs = {telemetry: _run(workload, telemetry) for telemetry in order}
        ratios.append(runs[True]["cpu_ms_per_step"] / runs[False]["cpu_ms_per_step"])
        off_ms.append(runs[False]["cpu_ms_per_step"])
    step_ms = statistics.median(off_ms)
    return {
        "workload": name,
        "steps": workload.max_steps,
        "logging_steps": workload.logging_steps,
        "off_cpu_ms_per_step": step_ms,
        "step_work_us": work,
        "window_us_per_step": window_us,
        "flops_ms": flops_ms,
        "run_end_ms": timed["finish_training"] * 1000,
        "cost_share": (work + window_us) / (step_ms * 1000),
        "pair_ratio": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "n": len(ratios)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="tiny,cls")
    parser.add_argument("--pairs", type=int, help="interleaved on/off pairs (default: tiny 6, cls 3)")
    parser.add_argument("--scale", default="full", choices=("full", "quick", "smoke"))
    parser.add_argument("--out", default=str(OUT))
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for name in options.workloads.split(","):
        result = measure(name, options.pairs or (6 if name == "tiny" else 3), options.scale)
        results.append(result)
        ratio = result["pair_ratio"]
        print(
            f"{name}: step {result['off_cpu_ms_per_step']:.3f} ms (off), telemetry work {result['step_work_us']:.2f} us"
            f" + windows {result['window_us_per_step']:.2f} us per step = {result['cost_share']:.2%} of a step; "
            f"on/off pairs {ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f}); "
            f"once: FLOPs measured in {result['flops_ms']:.1f} ms, the run's summary in {result['run_end_ms']:.1f} ms",
            flush=True,
        )
    Path(options.out).parent.mkdir(parents=True, exist_ok=True)
    Path(options.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
