"""A restart by the launcher is a request to go on: the run continues from its last complete checkpoint.

torchrun's elastic agent restarts the workers after a failure (`TORCHELASTIC_RESTART_COUNT` > 0) and SLURM requeues
a preempted job (`SLURM_RESTART_COUNT` > 0), each running the same script again. A script that calls `train()`
without `resume_from_checkpoint` would start over (the reference does), redoing every step and rewriting the
checkpoints; here such a `train()` continues from the newest complete checkpoint in `output_dir` and says so before
training. `HF_LIGHTNING_RESUME_ON_RESTART=0` keeps the reference's start-over; outside a restart nothing changes.
Every process continues from the checkpoint the first one chose.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hf_lightning.checkpoint.files import newest_valid_checkpoint

logger = logging.getLogger(__name__)

RESUME_ON_RESTART_ENV = "HF_LIGHTNING_RESUME_ON_RESTART"
# The launchers whose restart counter says this process runs the script again: variable -> the launcher's name.
_RESTART_COUNTERS = {
    "TORCHELASTIC_RESTART_COUNT": "torchrun's elastic agent",
    "SLURM_RESTART_COUNT": "a SLURM requeue",
}


@dataclass(frozen=True)
class LauncherRestart:
    """This process belongs to restart `count` of the job, made by `launcher`."""

    launcher: str
    count: int


def launcher_restart(environ: Mapping[str, str] = os.environ) -> LauncherRestart | None:
    """The launcher's restart this process belongs to, or None for a first start (or an unknown launcher)."""
    for variable, launcher in _RESTART_COUNTERS.items():
        value = environ.get(variable, "")
        if value.isdigit() and int(value) > 0:
            return LauncherRestart(launcher, int(value))
    return None


def checkpoint_after_restart(args: Any, environ: Mapping[str, str] = os.environ) -> str | None:
    """The checkpoint a `train()` without `resume_from_checkpoint` continues from after a launcher's restart (None:
    no restart, the opt-out set, or no complete checkpoint yet), the same on every process, said on the first."""
    restart = launcher_restart(environ)
    if restart is None or environ.get(RESUME_ON_RESTART_ENV, "1") in ("0", "false", "False"):
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
        print(
            f"hf_lightning: restart {restart.count} by {restart.launcher}: {said} "
            f"({RESUME_ON_RESTART_ENV}=0 starts over, as transformers.Trainer does).",
            file=sys.stderr,
            flush=True,
        )
    return checkpoint


def _first_process_choice(checkpoint: str | None) -> str | None:
    """Process 0's choice on every process (each may see its own disk), when the processes are connected."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return checkpoint
    choice = [checkpoint]
    dist.broadcast_object_list(choice, src=0)
    return choice[0]
