"""`benchmarks/step_floor.py`'s floor does the hand loop's work on the engine's loop, and only inside its block;
its `lightning_manual` runner does the same work on bare Lightning.

Each is read as "what this loop costs whatever the update does", which holds only if it trains exactly as the hand
loop does: same steps, same batches, same arithmetic, across an epoch boundary (where the engine's epoch hooks read
the counts the stand-in update keeps, and Lightning must reach the sampler's `set_epoch`).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.step_floor import hand_update_in_engine, run_floor, run_lightning_manual  # noqa: E402
from benchmarks.timing import StepClock  # noqa: E402
from benchmarks.train_runners import run_hand  # noqa: E402
from benchmarks.workloads import build_workload  # noqa: E402


def _trained(runner, steps: int, output_dir: Path) -> tuple[int, float]:
    clock = StepClock()
    result = runner(build_workload("tiny", "smoke", steps), clock, str(output_dir))
    return len(clock.wall), result["final_loss"]


def test_the_floor_trains_as_the_hand_loop_across_epochs(tmp_path):
    steps = 253
    workload = build_workload("tiny", "smoke", steps)
    assert workload.num_examples // workload.batch_size < steps  # the run crosses into a second epoch
    assert _trained(run_floor, steps, tmp_path / "floor") == _trained(run_hand, steps, tmp_path / "hand")


def test_bare_lightning_with_the_hand_update_trains_as_the_hand_loop_across_epochs(tmp_path):
    steps = 253
    hand = _trained(run_hand, steps, tmp_path / "hand")
    assert _trained(run_lightning_manual, steps, tmp_path / "lightning") == hand


def test_the_engine_update_is_restored_after_the_block():
    from hf_lightning.engine.module import HFLightningModule

    original = HFLightningModule.training_step
    with hand_update_in_engine():
        assert HFLightningModule.training_step is not original
    assert HFLightningModule.training_step is original
