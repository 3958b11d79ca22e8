"""One process per visible GPU for a script started with plain `python script.py` (docs/divergences.md).

The reference falls back to `nn.DataParallel` when one process sees several GPUs; Lightning has no
DataParallel, so we do what Lightning's own DDP launcher does: re-run the script once per extra device
with the launcher's environment variables set, and continue in this process as rank 0. Every process
then sees a distributed launch (`WORLD_SIZE`, `RANK`, `LOCAL_RANK`), so the arguments, the data dealing
and the DDP strategy are those of a `torchrun --nproc_per_node=N` run: the global batch is the
reference's `per_device_train_batch_size x N`. Listed in docs/divergences.md.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import subprocess
import sys
from typing import Any

from hf_lightning.args.process import _launched

logger = logging.getLogger(__name__)


def _already_launched() -> bool:

    return _launched()


def _interactive() -> bool:
    """A notebook or REPL cannot be re-run as a script (Lightning refuses subprocess launches there too)."""
    import __main__

    return not hasattr(__main__, "__file__") and getattr(__main__, "__spec__", None) is None


def devices_to_launch(args: Any) -> int:
    """How many processes a plain run of this script should become: the visible CUDA devices when there is
    more than one, no launcher started us, the arguments do not ask for the CPU and the session is a script;
    else 1 (nothing to launch)."""
    if _already_launched() or getattr(args, "use_cpu", False):
        return 1
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 2 or _interactive():
        return 1
    return torch.cuda.device_count()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def maybe_launch_over_devices(args: Any) -> None:
    """Called as the trainer is built: become N processes when `devices_to_launch(args)` says so."""
    count = devices_to_launch(args)
    if count > 1:
        launch_over_devices(count)


def launch_over_devices(num_processes: int) -> list[subprocess.Popen]:
    """Start ranks 1..N-1 as copies of this script and make this process rank 0 of N (one node); a no-op in
    a process a launcher (or this function) started.

    Sets `MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `RANK`, `LOCAL_RANK` and
    `NODE_RANK` as torchrun would. Lightning's process observer kills the group when a rank fails, and
    this process waits for the other ranks before it exits, so the command returns when the run is over.
    """
    if num_processes < 2 or _already_launched():
        return []  # a rank re-running the script, or a torchrun launch: the processes exist already
    from lightning.fabric.strategies.launchers.subprocess_script import (
        _basic_subprocess_cmd,
        _launch_process_observer,
    )

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.update(
        {"WORLD_SIZE": str(num_processes), "LOCAL_WORLD_SIZE": str(num_processes), "NODE_RANK": "0"}
    )
    command = list(_basic_subprocess_cmd())
    children = []
    for rank in range(1, num_processes):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        children.append(subprocess.Popen(command, env=env))
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0"})
    logger.info("Launched %d processes, one per device (this one is rank 0)", num_processes)
    _launch_process_observer(children)
    _stop_children_on_uncaught_error(children)
    atexit.register(_wait_for, children)
    return children


def _stop_children_on_uncaught_error(children: list[subprocess.Popen]) -> None:
    """Lightning's observer watches the other ranks only: if rank 0 dies of an error, they would wait in a
    collective until `ddp_timeout`; stop them so the command fails now."""
    previous_hook = sys.excepthook

    def hook(kind, value, traceback) -> None:
        for child in children:
            if child.poll() is None:
                child.kill()
        previous_hook(kind, value, traceback)

    sys.excepthook = hook


def _wait_for(children: list[subprocess.Popen]) -> None:
    for child in children:
        child.wait()
