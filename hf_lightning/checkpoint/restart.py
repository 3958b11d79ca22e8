"""A restart by the launcher is a request to go on: the run continues from its last complete checkpoint.

torchrun's elastic agent restarts the workers after a failure (`TORCHELASTIC_RESTART_COUNT` > 0), SLURM requeues
a preempted job (`SLURM_RESTART_COUNT` > 0) and Ray Train restarts its worker group (`FailureConfig`), handing it
the last reported checkpoint through `ray.train.get_checkpoint()`; each runs the same training function again. A script that calls `train()`
without `resume_from_checkpoint` would start over (the reference does), redoing every step and rewriting the
checkpoints; here such a `train()` continues from the newest complete checkpoint in `output_dir` (under Ray Train:
from Ray's checkpoint, which lives in Ray's storage, not on the lost worker's disk) and says so before training. `HF_LIGHTNING_RESUME_ON_RESTART=0` keeps the reference's start-over; outside a restart nothing changes.
Every process continues from the checkpoint the first one chose.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hf_lightning.checkpoint.files import checkpoint_problem, newest_valid_checkpoint, resume_problem

logger = logging.getLogger(__name__)

RESUME_ON_RESTART_ENV = "HF_LIGHTNING_RESUME_ON_RESTART"
# `ray.train.get_checkpoint()` is set when Ray restarts the group (FailureConfig) and when the user passes one to the
# trainer (`TorchTrainer(resume_from_checkpoint=...)`, e.g. with fewer workers): the same request to go on.
RAY_TRAIN = "Ray Train (FailureConfig restart or resume_from_checkpoint)"
# The folder `ray.train.huggingface.transformers.RayTrainReportCallback` puts the trainer's checkpoint in.
RAY_CHECKPOINT_FOLDER = "checkpoint"
# The launchers whose restart counter says this process runs the script again: variable -> the launcher's name.
_RESTART_COUNTERS = {
    "TORCHELASTIC_RESTART_COUNT": "torchrun's elastic agent",
    "SLURM_RESTART_COUNT": "a SLURM requeue",
}


@dataclass(frozen=True)
class LauncherRestart:
    """This process belongs to restart `count` of the job, made by `launcher`."""

    launcher: str
    count: int | None  # None: Ray Train, which hands over a checkpoint rather than a counter


def launcher_restart(environ: Mapping[str, str] = os.environ) -> LauncherRestart | None:
    """The launcher's restart this process belongs to, or None for a first start (or an unknown launcher)."""
    for variable, launcher in _RESTART_COUNTERS.items():
        value = environ.get(variable, "")
        if value.isdigit() and int(value) > 0:
            return LauncherRestart(launcher, int(value))
    return None


def ray_train_checkpoint() -> Any:
    """`ray.train.get_checkpoint()` inside a Ray Train worker (not None once Ray restarted or restored the group),
    else None. Ray is not imported here: a Ray Train worker has imported it already."""
    train = sys.modules.get("ray.train")
    if train is None:
        return None
    try:
        return train.get_checkpoint()
    # No Ray Train session in this process: the driver (RuntimeError), a Ray Tune trial (Ray raises DeprecationWarning).
    except (RuntimeError, ValueError, DeprecationWarning):
        return None


def _ray_checkpoint_folder(checkpoint: Any) -> str:
    """The trainer's checkpoint folder inside Ray's checkpoint: local storage is read in place, other storage is
    downloaded by Ray once (`Checkpoint.to_directory`)."""
    import pyarrow.fs  # lazy: Ray's own dependency, only in a restarted Ray Train worker

    local = isinstance(checkpoint.filesystem, pyarrow.fs.LocalFileSystem)
    root = checkpoint.path if local else checkpoint.to_directory()
    nested = os.path.join(root, RAY_CHECKPOINT_FOLDER)
    if os.path.isdir(nested):
        return nested
    newest = newest_valid_checkpoint(root, resume=True)[0]  # a checkpoint-<N> folder reported by other code
    return newest if newest is not None else root


def _disabled(environ: Mapping[str, str]) -> bool:
    return environ.get(RESUME_ON_RESTART_ENV, "1") in ("0", "false", "False")


def checkpoint_after_restart(args: Any, environ: Mapping[str, str] = os.environ) -> str | None:
    """The checkpoint a `train()` without `resume_from_checkpoint` continues from after a launcher's restart (None:
    no restart, the opt-out set, or no complete checkpoint yet), the same on every process, said on the first."""
    restart = launcher_restart(environ)
    if restart is None and not _disabled(environ):
        ray_checkpoint = ray_train_checkpoint()
        if ray_checkpoint is not None:
            return _checkpoint_from_ray(args, ray_checkpoint)
    if restart is None or _disabled(environ):
        return None
    checkpoint = None
    if os.path.isdir(args.output_dir):
        checkpoint = newest_valid_checkpoint(args.output_dir, resume=True)[0]
    checkpoint = _first_process_choice(checkpoint)
    if args.process_index == 0:
        said = (
            f"continuing from {checkpoint}" if checkpoint is not None
            else f"{args.output_dir} holds no complete checkpoint yet, so the run starts over"
        )
        _say(f"restart {restart.count} by {restart.launcher}: {said}")
    return checkpoint


def _checkpoint_from_ray(args: Any, ray_checkpoint: Any) -> str:
    """Ray's last reported checkpoint (every worker gets the same one from Ray), checked before training."""
    folder = _ray_checkpoint_folder(ray_checkpoint)
    problem = checkpoint_problem(folder) or resume_problem(folder)
    if problem is not None:
        raise ValueError(
            f"Ray Train handed the run checkpoint {folder} (ray.train.get_checkpoint()), which cannot be resumed: "
            f"{problem}. Report checkpoints with ray.train.huggingface.transformers.RayTrainReportCallback, or set "
            f"{RESUME_ON_RESTART_ENV}=0 to start over."
        )
    if args.process_index == 0:
        _say(f"handed a checkpoint by {RAY_TRAIN}: continuing from Ray's checkpoint {folder}")
    return folder


def _say(line: str) -> None:
    print(
        f"hf_lightning: {line} ({RESUME_ON_RESTART_ENV}=0 starts over, as transformers.Trainer does).",
        file=sys.stderr,
        flush=True,
    )


def _first_process_choice(checkpoint: str | None) -> str | None:
    """Process 0's choice on every process (each may see its own disk), when the processes are connected."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return checkpoint
    choice = [checkpoint]
    dist.broadcast_object_list(choice, src=0)
    return choice[0]
