"""Under SLURM with Lightning's auto-requeue: the scheduler's warning signal becomes one of our checkpoints.

A job submitted with `--signal=USR1@<seconds>` gets the requeue signal (Lightning's `SLURMEnvironment.requeue_signal`,
SIGUSR1 by default) shortly before its time ends. Lightning's own handler saves an `hpc_ckpt_<n>.ckpt` in the middle
of whatever the process was doing and requeues the job; here instead, every process stops at the next update
boundary (the processes agree through one small all-reduce per update, as `enable_jit_checkpoint` does), the step is
saved as one complete HF checkpoint by the usual save path, the main process asks SLURM to requeue the job
(`scontrol requeue <job id>`, the command Lightning runs), and every process then ends by the signal, as a process
of the reference ends on it. The requeued job (`SLURM_RESTART_COUNT` > 0) continues from that checkpoint
(hf_lightning/checkpoint/restart.py). A handler the user installed for the signal before `train()` is kept.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
from typing import Any

from hf_lightning.engine.interrupt_report import own_line

logger = logging.getLogger(__name__)

REQUEUED_MESSAGE = "hf_lightning: SLURM's requeue signal during train():"


class SlurmRequeue:
    """One `train()` call's requeue request: recorded by the signal, agreed at an update boundary, served after the
    boundary's checkpoint is complete."""

    def __init__(self, signum: int):
        self.signum = signum
        self.requested = False  # this process received the signal
        self.saved_at: int | None = None  # the step whose checkpoint serves the request

    def request(self, signum: int, frame: Any) -> None:
        """The signal handler: only records the request (the save happens at the next update boundary)."""
        if not self.requested:
            logger.info("SLURM's requeue signal received: a checkpoint will be saved at the next update boundary.")
        self.requested = True

    def due_now(self, device: Any) -> bool:
        """Whether any process received the signal: an all-reduce of the flag (every process calls it at every
        update boundary until the request is served, so the calls pair up)."""
        if self.saved_at is not None:
            return False
        # lazy: only runs under SLURM's auto-requeue
        from hf_lightning.strategies.distributed import any_process

        return any_process(self.requested, device)

    def requeue_and_end(self, output_dir: str, is_main_process: bool) -> None:
        """After the checkpoint is complete on disk: the main process requeues the job, then every process ends by
        the signal (once all have arrived, so no process's end cuts another's short)."""
        checkpoint = os.path.join(output_dir, f"checkpoint-{self.saved_at}")
        if is_main_process:
            requeued = _requeue(slurm_job_id())
            print(
                own_line(
                    f"{REQUEUED_MESSAGE} saved {checkpoint} at step {self.saved_at}; "
                    + ("the job is requeued and continues from it." if requeued else
                       "`scontrol requeue` failed; resume with: "
                       f"trainer.train(resume_from_checkpoint={checkpoint!r})")
                ),
                file=sys.stderr,
                flush=True,
            )
        import torch.distributed as dist  # lazy: only runs under SLURM's auto-requeue

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()
        for handler in logging.getLogger().handlers:
            handler.flush()
        signal.signal(self.signum, signal.SIG_DFL)
        os.kill(os.getpid(), self.signum)


def slurm_job_id() -> str:
    """The id `scontrol requeue` takes: an array task's `<array job>_<task>`, else `SLURM_JOB_ID` (as Lightning)."""
    array_job_id = os.environ.get("SLURM_ARRAY_JOB_ID")
    job_id = (
        f"{array_job_id}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job_id is not None
        else os.environ["SLURM_JOB_ID"]
    )
    if not re.fullmatch(r"[0-9_-]+", job_id):
        raise ValueError(f"SLURM job id {job_id!r} is not a SLURM job id (digits, '_' and '-').")
    return job_id


def _requeue(job_id: str) -> bool:
    """`scontrol requeue <job_id>`; whether it succeeded (a failure is said, not raised: the checkpoint is there)."""
    try:
        result = subprocess.call(["scontrol", "requeue", job_id])
    except FileNotFoundError:
        logger.warning("`scontrol` was not found on PATH: the job could not be requeued.")
        return False
    if result != 0:
        logger.warning(f"`scontrol requeue {job_id}` failed with exit status {result}.")
    return result == 0
