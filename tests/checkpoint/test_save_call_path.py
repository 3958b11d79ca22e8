"""The call path of one save: from the step boundary down to each file it writes and to the commit, the save
crosses at most three of hf_lightning's modules beyond the caller, straight down (no module entered twice).

At each named save point (checkpoint/fault_points.py: every file, the fsync, the marker, the rename, the rotation)
the stack is read from the step boundary's frame (`_maybe_log_save_evaluate`) to the frame that reached the point;
consecutive frames of one module count once. A subclass overriding a save hook is the one exception the design
allows (its hooks are called on the training thread, docs/design.md "Saves that flow down").
"""

from __future__ import annotations

import sys
import threading

import pytest

from hf_lightning import TrainingArguments
from hf_lightning.checkpoint.fault_points import fault_hook
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.models import make_regression_mlp, regression_data

STEP_BOUNDARY = "_maybe_log_save_evaluate"
WRITER_THREAD_START = "_write"  # the background writer's thread function (checkpoint/async_writes.py)


def module_path(start: str) -> list[str]:
    """hf_lightning's modules on this thread's stack from the frame of function `start` down to the frame that
    reached the save point, consecutive frames of one module once (fault_points itself left out)."""
    frames = []
    frame = sys._getframe(2)  # the caller of `reach`
    while frame is not None:
        frames.append(frame)
        if frame.f_code.co_name == start and frame.f_globals.get("__name__", "").startswith("hf_lightning."):
            break
        frame = frame.f_back
    else:
        return []
    path: list[str] = []
    for frame in reversed(frames):
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("hf_lightning.") or module == "hf_lightning.checkpoint.fault_points":
            continue
        module = module.removeprefix("hf_lightning.")
        if not path or path[-1] != module:
            path.append(module)
    return path


def record_one_save(tmp_path, asynchronous: bool = False) -> dict[str, list[str]]:
    """The module path at each save point of the step-2 save of a tiny run."""
    paths: dict[str, list[str]] = {}

    def hook(point: str) -> None:
        if point.startswith("step:") or point in ("snapshot", "wait_pending") or point in paths:
            return
        on_main = threading.current_thread() is threading.main_thread()
        paths[point] = module_path(STEP_BOUNDARY if on_main else WRITER_THREAD_START)

    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", disable_tqdm=True, per_device_train_batch_size=2,
        max_steps=2, save_steps=2, logging_steps=1, seed=0,
    )  # fmt: skip
    trainer = HFLightningTrainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(4))
    if asynchronous:
        from lightning.pytorch.plugins.io import AsyncCheckpointIO

        trainer.lightning_trainer_overrides = {"plugins": [AsyncCheckpointIO()]}
    with fault_hook(hook):
        trainer.train()
    return paths


def hops(path: list[str]) -> int:
    """Module crossings along one path (from the caller)."""
    return len(path) - 1


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_one_save_crosses_at_most_three_modules_straight_down(tmp_path, asynchronous):
    paths = record_one_save(tmp_path, asynchronous)
    assert {"model", "optimizer", "scheduler", "rng", "trainer_state", "fsync", "marker", "rename", "rotate"} <= set(
        paths
    ), paths
    caller = "checkpoint.async_writes" if asynchronous else "trainer.step_methods"
    for point, path in paths.items():
        assert path and path[0] == caller, (point, path)
        assert hops(path) <= 3, (point, path)
        assert len(set(path)) == len(path), (point, path)  # no module entered twice on the way down
