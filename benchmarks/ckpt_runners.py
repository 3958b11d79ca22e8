"""The `ckpt` workload: one checkpoint save and one resume-load of the `cls` run.

Runners:
- `bare`: the hand-written loop, then `safetensors.save_file` + `torch.save` of the same state (weights,
  optimizer, scheduler, RNG) and the matching loads;
- `transformers`, `hf_lightning`: train 4 steps with `save_steps=2`; each save is timed from `on_step_end`
  to `on_save` (nothing else runs between them: no log or evaluation is due).

`first_save_s` is the first save of the process (step 2), which pays one-off costs such as imports;
`save_s` is the second (step 4), the cost of every later save. The bare runner saves twice the same way.

Resume-load: the time from `train()` to `on_train_begin` (weights, optimizer and scheduler are loaded
before it in both libraries) with `resume_from_checkpoint`, minus the same without it; each is the best
of `resume_tries` (a second `Trainer` in the same process, aborted at `on_train_begin`).
`os.fsync` is wrapped in every runner, so the fsync share of a save is measured, not estimated.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from benchmarks.timing import StepClock
from benchmarks.train_runners import train_by_hand
from benchmarks.workloads import Workload


class FsyncTimer:
    """Wraps `os.fsync` for the whole process: between `reset()` and `read()`, the calls and the wall time during
    which at least one fsync was in flight (fsyncs on several threads overlap: their union is what a save waits)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._active = 0
        self._busy_since = 0.0
        self._lock = threading.Lock()
        self._original = os.fsync
        os.fsync = self._timed_fsync

    def _timed_fsync(self, fd: int) -> None:
        with self._lock:
            if self._active == 0:
                self._busy_since = time.perf_counter()
            self._active += 1
        try:
            self._original(fd)
        finally:
            with self._lock:
                self._active -= 1
                self.calls += 1
                if self._active == 0:
                    self.seconds += time.perf_counter() - self._busy_since

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def read(self) -> dict[str, float]:
        return {"fsync_s": self.seconds, "fsync_calls": self.calls}


def folder_bytes(path: str) -> int:
    """Total size of the files under `path`."""
    return sum(
        os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names
    )


# ---- bare safetensors + torch.save ---------------------------------------------------------------------------
def run_bare_ckpt(workload: Workload, clock: StepClock, output_dir: str) -> dict[str, Any]:
    """Save and load the same state with plain safetensors / torch calls (no fsync, no atomic rename)."""
    from safetensors.torch import load_file, save_file

    clock.imports_done()
    fsync = FsyncTimer()
    model, optimizer, scheduler = train_by_hand(workload, clock)
    folder = os.path.join(output_dir, "checkpoint-bare")

    def save() -> None:
        os.makedirs(folder, exist_ok=True)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, f"{folder}/model.safetensors")
        torch.save(optimizer.state_dict(), f"{folder}/optimizer.pt")
        torch.save(scheduler.state_dict(), f"{folder}/scheduler.pt")
        rng = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "cpu": torch.random.get_rng_state(),
        }
        torch.save(rng, f"{folder}/rng_state.pth")

    def load() -> None:
        model.load_state_dict(load_file(f"{folder}/model.safetensors"))
        optimizer.load_state_dict(torch.load(f"{folder}/optimizer.pt", weights_only=True))
        scheduler.load_state_dict(torch.load(f"{folder}/scheduler.pt", weights_only=True))
        rng = torch.load(f"{folder}/rng_state.pth", weights_only=False)
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.random.set_rng_state(rng["cpu"])

    saves = []
    for _ in range(2):  # the first save of the process, then a warm one (as the trainers' steps 2 and 4)
        shutil.rmtree(folder, ignore_errors=True)
        fsync.reset()
        start = time.perf_counter()
        save()
        saves.append(time.perf_counter() - start)
    fsync_stats = fsync.read()
    start = time.perf_counter()
    load()
    return {
        "first_save_s": saves[0],
        "save_s": saves[1],
        "save_without_fsync_s": saves[1] - fsync_stats["fsync_s"],
        "resume_load_s": time.perf_counter() - start,
        "checkpoint_bytes": folder_bytes(folder),
        **fsync_stats,
    }


# ---- transformers.Trainer and hf_lightning -------------------------------------------------------------------
class _StopAtTrainBegin(Exception):
    """Raised from `on_train_begin` to end a resume measurement once everything is loaded."""


def _run_hf_style_ckpt(
    workload: Workload,
    clock: StepClock,
    output_dir: str,
    trainer_cls: type,
    args_cls: type,
    callback_base: type,
) -> dict[str, Any]:
    fsync = FsyncTimer()
    marks: dict[str, float] = {}
    saves: list[dict[str, float]] = []

    class SaveClock(callback_base):
        def on_step_end(self, args, state, control, **kwargs):
            clock.tick()
            fsync.reset()
            marks["step_end"] = time.perf_counter()

        def on_save(self, args, state, control, **kwargs):
            saves.append({"save_s": time.perf_counter() - marks["step_end"], **fsync.read()})

    class StopAtTrainBegin(callback_base):
        def on_train_begin(self, args, state, control, **kwargs):
            marks["train_begin"] = time.perf_counter()
            raise _StopAtTrainBegin

    run_dir = os.path.join(output_dir, "run")
    args = {**workload.trainer_args(run_dir), "save_strategy": "steps", "save_steps": workload.max_steps // 2}
    trainer = trainer_cls(
        model=workload.seeded_model(),
        args=args_cls(**args),
        train_dataset=workload.train_dataset(),
        callbacks=[SaveClock()],
    )
    trainer.train()
    checkpoint = os.path.join(run_dir, f"checkpoint-{workload.max_steps}")
    first, warm = saves
    result: dict[str, Any] = {
        "first_save_s": first["save_s"],
        "save_s": warm["save_s"],
        "save_without_fsync_s": warm["save_s"] - warm["fsync_s"],
        "fsync_s": warm["fsync_s"],
        "fsync_calls": warm["fsync_calls"],
        "checkpoint_bytes": folder_bytes(checkpoint),
    }

    def time_to_train_begin(resume: str | None, attempt: int) -> float:
        resume_args = {**workload.trainer_args(os.path.join(output_dir, f"resume-{attempt}"))}
        resume_args["max_steps"] = workload.max_steps + 1
        resumed = trainer_cls(
            model=workload.seeded_model(),
            args=args_cls(**resume_args),
            train_dataset=workload.train_dataset(),
            callbacks=[StopAtTrainBegin()],
        )
        start = time.perf_counter()
        try:
            resumed.train(resume_from_checkpoint=resume)
        except _StopAtTrainBegin:
            return marks["train_begin"] - start
        raise RuntimeError("on_train_begin never fired")

    fresh, resumed = [], []
    try:
        for attempt in range(workload.extra["resume_tries"]):
            fresh.append(time_to_train_begin(None, attempt))
            resumed.append(time_to_train_begin(checkpoint, attempt))
    except (ValueError, NotImplementedError) as error:  # resume not supported (yet)
        result["resume_error"] = f"{type(error).__name__}: {str(error)[:200]}"
        return result
    result.update(
        fresh_to_train_begin_s=min(fresh),
        resume_to_train_begin_s=min(resumed),
        resume_load_s=max(0.0, min(resumed) - min(fresh)),
    )
    return result


def run_transformers_ckpt(workload: Workload, clock: StepClock, output_dir: str) -> dict[str, Any]:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    clock.imports_done()
    return _run_hf_style_ckpt(workload, clock, output_dir, Trainer, TrainingArguments, TrainerCallback)


def run_hf_lightning_ckpt(workload: Workload, clock: StepClock, output_dir: str) -> dict[str, Any]:
    from hf_lightning import Trainer, TrainerCallback, TrainingArguments

    clock.imports_done()
    result = _run_hf_style_ckpt(workload, clock, output_dir, Trainer, TrainingArguments, TrainerCallback)
    result.update(_async_saves(workload, output_dir, Trainer, TrainingArguments, TrainerCallback))
    return result


def _async_saves(
    workload: Workload, output_dir: str, trainer_cls: type, args_cls: type, callback_base: type
) -> dict[str, Any]:
    """The same run with Lightning's `AsyncCheckpointIO`: what a save blocks training for (`on_step_end` ->
    `on_save`, the copy of the state off the device), and the checkpoints' agreement with the synchronous ones."""
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    marks: dict[str, float] = {}
    blocking: list[float] = []

    class SaveClock(callback_base):
        def on_step_end(self, args, state, control, **kwargs):
            marks["step_end"] = time.perf_counter()

        def on_save(self, args, state, control, **kwargs):
            blocking.append(time.perf_counter() - marks["step_end"])

    run_dir = os.path.join(output_dir, "run-async")
    args = {**workload.trainer_args(run_dir), "save_strategy": "steps", "save_steps": workload.max_steps // 2}
    trainer = trainer_cls(
        model=workload.seeded_model(),
        args=args_cls(**args),
        train_dataset=workload.train_dataset(),
        callbacks=[SaveClock()],
    )
    trainer.lightning_trainer_overrides = {"plugins": [AsyncCheckpointIO()]}
    trainer.train()  # returns once the last background write is committed
    from safetensors.torch import load_file

    name = f"checkpoint-{workload.max_steps}"
    synchronous = load_file(os.path.join(output_dir, "run", name, "model.safetensors"))
    background = load_file(os.path.join(run_dir, name, "model.safetensors"))
    same = synchronous.keys() == background.keys() and all(torch.equal(synchronous[k], background[k]) for k in synchronous)
    if not same:
        raise RuntimeError("the asynchronous checkpoint's weights differ from the synchronous run's")
    return {"async_first_save_s": blocking[0], "async_save_s": blocking[1]}


CKPT_RUNNERS: dict[str, Callable[[Workload, StepClock, str], dict[str, Any]]] = {
    "bare": run_bare_ckpt,
    "transformers": run_transformers_ckpt,
    "hf_lightning": run_hf_lightning_ckpt,
}
