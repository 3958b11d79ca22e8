"""The call path of one resume: from the `Resumer` (checkpoint/resume.py) down to each file it reads and each state
it applies, a resume crosses at most three of hf_lightning's modules, straight down (no module entered twice).

Each file read (`torch.load`, safetensors) and each state applied (the model's, the optimizer's and the scheduler's
`load_state_dict`, the torch generator's state) is recorded with the stack from the outermost `Resumer` frame to the
frame that reached it; consecutive frames of one module count once. The facade's reference-named load hooks
(`_load_from_checkpoint`, `_load_optimizer_and_scheduler`, `_load_rng_state`, ...) are on the way, so an override
of them is what runs (docs/design.md, "The resume path").
"""

from __future__ import annotations

import os
import sys

import safetensors.torch
import torch

from hf_lightning import TrainingArguments
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.models import make_regression_mlp, regression_data

RESUMER = "hf_lightning.checkpoint.resume"


def module_path() -> list[str]:
    """hf_lightning's modules on the stack from the outermost Resumer frame down to the caller of the recorded call,
    consecutive frames of one module once; empty outside a resume."""
    frames = []
    frame = sys._getframe(2)
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()
    starts = [i for i, f in enumerate(frames) if f.f_globals.get("__name__") == RESUMER]
    if not starts:
        return []
    path: list[str] = []
    for frame in frames[starts[0] :]:
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("hf_lightning."):
            continue
        module = module.removeprefix("hf_lightning.")
        if not path or path[-1] != module:
            path.append(module)
    return path


def record_one_resume(tmp_path, monkeypatch) -> dict[str, list[list[str]]]:
    """The module paths of every read and load of a tiny run resumed from its step-2 checkpoint."""
    paths: dict[str, list[list[str]]] = {}

    def recording(point: str, function):
        def wrapper(*args, **kwargs):
            path = module_path()
            if path:
                paths.setdefault(point, []).append(path)
            return function(*args, **kwargs)

        return wrapper

    def args() -> TrainingArguments:
        return TrainingArguments(
            output_dir=str(tmp_path), use_cpu=True, report_to="none", disable_tqdm=True, per_device_train_batch_size=2,
            max_steps=4, save_steps=2, logging_steps=1, seed=0,
        )  # fmt: skip

    HFLightningTrainer(model=make_regression_mlp(), args=args(), train_dataset=regression_data(8)).train()
    resumed = HFLightningTrainer(model=make_regression_mlp(), args=args(), train_dataset=regression_data(8))
    monkeypatch.setattr(torch, "load", recording("read torch file", torch.load))
    monkeypatch.setattr(safetensors.torch, "load_file", recording("read weights", safetensors.torch.load_file))
    monkeypatch.setattr(torch.nn.Module, "load_state_dict", recording("model", torch.nn.Module.load_state_dict))
    monkeypatch.setattr(torch.optim.Optimizer, "load_state_dict", recording("optimizer", torch.optim.Optimizer.load_state_dict))
    scheduler_class = torch.optim.lr_scheduler.LambdaLR  # the linear schedule's class
    monkeypatch.setattr(scheduler_class, "load_state_dict", recording("scheduler", scheduler_class.load_state_dict))
    monkeypatch.setattr(torch.random, "set_rng_state", recording("rng", torch.random.set_rng_state))
    resumed.train(resume_from_checkpoint=os.path.join(str(tmp_path), "checkpoint-2"))
    assert resumed.state.global_step == 4
    return paths


def test_one_resume_crosses_at_most_three_modules_straight_down(tmp_path, monkeypatch):
    paths = record_one_resume(tmp_path, monkeypatch)
    assert {"read torch file", "read weights", "model", "optimizer", "scheduler", "rng"} <= set(paths), paths
    for point, point_paths in paths.items():
        for path in point_paths:
            assert path[0] == "checkpoint.resume", (point, path)
            assert len(path) - 1 <= 3, (point, path)
            assert len(set(path)) == len(path), (point, path)  # no module entered twice on the way down
    # The reference-named hooks are on the way (an override of them is what runs).
    for point in ("read weights", "model", "optimizer", "scheduler", "rng"):
        assert all("trainer.checkpoint_methods" in path for path in paths[point]), (point, paths[point])
