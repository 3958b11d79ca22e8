"""How much of hf_lightning's per-step overhead is the engine's Lightning loop itself, whatever the update does.

    python benchmarks/step_floor.py                 # tiny, 4 repeats of 2,000 steps
    python benchmarks/step_floor.py --repeats 6 --steps 3000

Four runners, interleaved in fresh processes pinned to one core with one thread: the hand-written loop,
`lightning_manual` (a bare LightningModule under manual optimization whose `training_step` is the hand loop's update
in plain torch calls, on Lightning's own loop: what running on Lightning costs before any engine), the `floor` (the
engine running the hand loop's update as its `training_step`: the batch drawn through Lightning's fetcher and the
engine's iterator, forward, backward, clip, optimizer and scheduler step, zero_grad, the step-end event; none of the
reference's bookkeeping) and hf_lightning. `floor / hand` is what the engine's loop and data path cost on their own;
`hf_lightning / floor` is what the reference's semantics add on top.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.timing import StepClock  # noqa: E402
from benchmarks.train_runners import (  # noqa: E402
    MAX_GRAD_NORM,
    bare_lightning_options,
    linear_schedule,
    reference_optimizer,
    run_hand,
    run_hf_lightning,
    training_loader,
)
from benchmarks.workloads import EpochSeededSampler, Workload, build_workload, probe_loss  # noqa: E402

RUNNERS = ("hand", "lightning_manual", "floor", "hf_lightning")


def _hand_update_as_training_step(module: Any, dataloader_iter: Iterator) -> None:
    """One engine update doing only what the hand loop does (`HFLightningModule.training_step`'s stand-in)."""
    import torch

    from hf_lightning.engine.module import _BatchIterator

    facade, run, fit = module._facade, module._run, module._fit_view()
    batch = next(_BatchIterator(dataloader_iter, module, fit))
    # The counts the engine's epoch hooks read: the epoch ends after its windows, and one with no micro-batch
    # drawn would end the run.
    run.updates_done_in_epoch += 1
    module._micro_batch_index += 1
    model = facade.model_wrapped
    model(**batch)["loss"].backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), facade.args.max_grad_norm)
    fit.optimizer.optimizer.step()
    facade.lr_scheduler.step()
    model.zero_grad()
    facade.state.global_step += 1
    facade._fire("on_step_end")  # the benchmark clock's tick and the flow callback's stop at max_steps
    if facade.control.should_training_stop:
        module.trainer.should_stop = True


@contextlib.contextmanager
def hand_update_in_engine() -> Iterator[None]:
    """Within the block, the engine's update is the hand loop's (restored afterwards)."""
    from hf_lightning.engine.module import HFLightningModule

    original = HFLightningModule.training_step
    HFLightningModule.training_step = _hand_update_as_training_step
    try:
        yield
    finally:
        HFLightningModule.training_step = original


def run_floor(workload: Workload, clock: StepClock, output_dir: str) -> dict[str, Any]:
    """hf_lightning's runner with the hand loop's update in place of the engine's."""
    with hand_update_in_engine():
        return run_hf_lightning(workload, clock, output_dir)


def run_lightning_manual(workload: Workload, clock: StepClock, output_dir: str) -> dict[str, Any]:
    """Lightning's own loop with the hand loop's update as a manual-optimization `training_step`, no engine."""
    import lightning.pytorch as pl
    import torch

    if workload.grad_accum != 1 or workload.passes_num_items:
        raise ValueError(f"lightning_manual runs one batch per update without item counts, not {workload.name!r}")
    clock.imports_done()

    class HandUpdate(pl.LightningModule):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model
            self.automatic_optimization = False

        def configure_optimizers(self) -> torch.optim.Optimizer:
            self.optimizer = reference_optimizer(self.model, workload.learning_rate)
            self.scheduler = linear_schedule(self.optimizer, workload.max_steps)
            return self.optimizer

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
            self.model(**batch)["loss"].backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), MAX_GRAD_NORM)
            self.optimizer.step()
            self.scheduler.step()
            self.model.zero_grad()
            clock.tick()

        def on_train_batch_end(self, *args: Any) -> None:
            if len(clock.wall) >= workload.max_steps:  # manual steps leave Lightning's max_steps counter alone
                self.trainer.should_stop = True

    dataset = workload.train_dataset()
    module = HandUpdate(workload.seeded_model())
    trainer = pl.Trainer(**bare_lightning_options(output_dir))
    trainer.fit(module, train_dataloaders=training_loader(workload, dataset, EpochSeededSampler(len(dataset))))
    return {"final_loss": probe_loss(module.model, workload)}


_RUN = {
    "hand": run_hand,
    "lightning_manual": run_lightning_manual,
    "floor": run_floor,
    "hf_lightning": run_hf_lightning,
}


def child(runner: str, steps: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    workload, clock = build_workload("tiny", "full", steps), StepClock()
    with tempfile.TemporaryDirectory() as output_dir:
        result = _RUN[runner](workload, clock, output_dir)
    return {
        "runner": runner,
        "steps": len(clock.wall),
        "ms_per_step": clock.summary()["ms_per_step"],
        "final_loss": result["final_loss"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--cpu", default="0", help="the core every run is pinned to")
    parser.add_argument("--child", choices=RUNNERS, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        print(json.dumps(child(options.child, options.steps)))
        return 0
    from benchmarks.run import worker_env

    times: dict[str, list[float]] = {runner: [] for runner in RUNNERS}
    losses: dict[str, float] = {}
    for _ in range(options.repeats):
        for runner in RUNNERS:
            command = ["taskset", "-c", options.cpu, sys.executable, __file__, "--child", runner]
            output = subprocess.run(
                [*command, "--steps", str(options.steps)],
                env=worker_env(1), cwd=REPO, check=True, capture_output=True, text=True,
            ).stdout
            result = json.loads(output.strip().splitlines()[-1])
            if result["steps"] != options.steps:
                raise RuntimeError(f"{runner} ran {result['steps']} steps, not {options.steps}")
            times[runner].append(result["ms_per_step"])
            losses[runner] = result["final_loss"]
    if len(set(losses.values())) != 1:  # the four do the same arithmetic on the same batches
        raise RuntimeError(f"the runners' final losses differ, so they did not train alike: {losses}")
    median = {runner: statistics.median(values) for runner, values in times.items()}
    for runner in RUNNERS:
        spread = f"{min(times[runner]):.3f}-{max(times[runner]):.3f}"
        print(f"{runner:>12}: {median[runner]:.3f} ms/step ({spread})  final loss {losses[runner]:.6f}")
    hand, floor, ours = median["hand"], median["floor"], median["hf_lightning"]
    print(f"lightning_manual / hand {median['lightning_manual'] / hand:.3f}   floor / hand {floor / hand:.3f}   "
          f"hf_lightning / hand {ours / hand:.3f}   hf_lightning / floor {ours / floor:.3f}")
    print(f"share of hf_lightning's overhead over the hand loop that is the floor: {(floor - hand) / (ours - hand):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
