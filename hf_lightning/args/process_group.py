"""Creating the default `torch.distributed` process group from the arguments and the launcher's variables.

Kept apart from the collectives (`hf_lightning/strategies/distributed.py`) so that the arguments'
`main_process_first` can create the group, as the reference's arguments do when they are built.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hf_lightning.args.launcher import launch_layout

__all__ = ["default_backend", "ensure_process_group", "under_elastic_agent"]

_LAUNCHER_VARIABLES = ("MASTER_ADDR", "MASTER_PORT")


def default_backend(args: Any) -> str:
    """`args.ddp_backend` when set, else `nccl` for a CUDA device and `gloo` otherwise (accelerate's choice)."""
    if getattr(args, "ddp_backend", None):
        return args.ddp_backend
    return "nccl" if args.device.type == "cuda" else "gloo"


def ensure_process_group(args: Any) -> bool:
    """Initialise the default process group when `args.world_size > 1` and none exists yet.

    Returns whether a multi-process group is in place afterwards. Rank and world size come from the
    launcher's variables (through `args`), the backend from `default_backend`, the timeout from
    `args.ddp_timeout` seconds. A group created here is the one Lightning's DDP strategy later reuses.
    """
    if args.world_size <= 1:
        return False
    if not dist.is_available():
        raise ValueError(
            f"world_size={args.world_size} (from the launcher's WORLD_SIZE) needs torch.distributed, which this "
            "torch build lacks; run a single process or install a torch with distributed support."
        )
    if dist.is_initialized():
        return dist.get_world_size() > 1
    _fill_slurm_address()
    missing = [name for name in _LAUNCHER_VARIABLES if not os.environ.get(name)]
    if missing:
        raise ValueError(
            f"world_size={args.world_size} but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
            "set, so the processes cannot find each "
            "other; start the script with `torchrun --nproc_per_node=N script.py` (or set MASTER_ADDR and "
            "MASTER_PORT), or unset WORLD_SIZE for a single process."
        )
    device = args.device
    if device.type == "cuda":
        # NCCL binds each process to its own device; it must be current before the group exists.
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=args.ddp_timeout)
    dist.init_process_group(
        backend=default_backend(args),
        timeout=timeout,
        rank=args.process_index,
        world_size=args.world_size,
        store=elastic_attempt_store(args.process_index, args.world_size, timeout),
    )
    # Tear the group down before the interpreter does: a gloo group left for the C++ destructors at exit can
    # abort the process ("terminate called without an active exception") after all work succeeded.
    atexit.register(_destroy_process_group)
    return True


def under_elastic_agent() -> bool:
    """Whether torchrun's elastic agent started this process (it sets the attempt counter, 0 on the first)."""
    return "TORCHELASTIC_RESTART_COUNT" in os.environ


def elastic_attempt_store(rank: int, world_size: int, timeout: timedelta) -> Any:
    """Under torchrun's elastic agent, the rendezvous store seen through a prefix of this attempt
    (`TORCHELASTIC_RESTART_COUNT`), so the workers of a restarted attempt never read the entries the dead attempt's
    workers left there (gloo then dials their closed ports: "connectFullMesh failed ... Connection refused").
    None outside torchrun: `init_process_group` builds its own store from MASTER_ADDR / MASTER_PORT."""
    if not under_elastic_agent():
        return None
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.TCPStore(
        host_name=os.environ["MASTER_ADDR"],
        port=int(os.environ["MASTER_PORT"]),
        world_size=world_size,
        is_master=not agent_store and rank == 0,  # the agent hosts it, else rank 0 (torch's own rule)
        timeout=timeout,
        multi_tenant=not agent_store,
    )
    return dist.PrefixStore(f"hf_lightning/attempt_{attempt}", store)


def _fill_slurm_address() -> None:
    """Under `srun` (no torchrun), MASTER_ADDR / MASTER_PORT as Lightning's SLURMEnvironment derives them (the
    first node of SLURM_NODELIST, a port from SLURM_JOB_ID), so a group created here is the one Lightning joins."""
    layout = launch_layout()
    if layout is None or layout.source != "slurm":
        return
    from lightning.fabric.plugins.environments import SLURMEnvironment

    environment = SLURMEnvironment(auto_requeue=False)
    environment.main_address  # noqa: B018 - each property writes its variable when unset
    environment.main_port  # noqa: B018


# How long a process waits at exit for the others before it destroys the group anyway.
_EXIT_WAIT = timedelta(seconds=10)


def _destroy_process_group() -> None:
    """Destroy the default process group if it still exists (registered at exit by `ensure_process_group`).

    On gloo the processes first wait for each other (a barrier bounded by `_EXIT_WAIT`): a process that destroys its
    group while a peer's connections are still open can be aborted ("terminate called without an active exception",
    seen in about one in eight runs of a job torchrun had restarted, none with the barrier)."""
    if dist.is_available() and dist.is_initialized():
        if dist.get_backend() == "gloo" and dist.get_world_size() > 1:
            with contextlib.suppress(RuntimeError):  # a peer gone or late: the group goes all the same
                dist.monitored_barrier(timeout=_EXIT_WAIT)
        dist.destroy_process_group()
