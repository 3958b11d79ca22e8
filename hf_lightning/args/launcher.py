"""The process layout a launcher gave this process: torchrun's variables, else SLURM's (`srun`).

torchrun (and Lightning's own launcher, accelerate launch, mpirun via `WORLD_SIZE`) sets `WORLD_SIZE`,
`RANK`, `LOCAL_RANK` and `LOCAL_WORLD_SIZE` (and the node's index as `GROUP_RANK`; Ray Train's `TorchConfig` sets the
same names with `NODE_RANK`, read from `ray.train.get_context()`); they win when present. Without them, a process that `srun`
started reads `SLURM_NTASKS`, `SLURM_PROCID`, `SLURM_LOCALID`, `SLURM_NODEID` and `SLURM_NTASKS_PER_NODE`,
as Lightning's `SLURMEnvironment` does, which then runs the job; a job named `bash` or `interactive` is
Lightning's opt-out of SLURM detection and is treated as not launched.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["LaunchLayout", "launch_layout"]


@dataclass(frozen=True)
class LaunchLayout:
    """Ranks and sizes of a launched process; `source` is "torchrun" or "slurm"."""

    world_size: int
    rank: int
    local_rank: int
    local_world_size: int
    source: str
    # The node's index as the launcher gave it (-1: not given), which nodes holding different process counts need.
    given_node_rank: int = -1

    @property
    def num_nodes(self) -> int:
        """Nodes in the run: processes over processes per node."""
        return max(1, self.world_size // max(1, self.local_world_size))

    @property
    def node_rank(self) -> int:
        """This process's node: the launcher's index, else derived from the rank (ranks are numbered node by node,
        which gives the node only when every node holds `local_world_size` processes)."""
        if self.given_node_rank >= 0:
            return self.given_node_rank
        return self.rank // max(1, self.local_world_size)


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    value = environ.get(name, "")
    return int(value) if value.strip().lstrip("-").isdigit() else default


def _torchrun(environ: Mapping[str, str]) -> LaunchLayout | None:
    local_rank = _int(environ, "LOCAL_RANK", -1)
    world_size = _int(environ, "WORLD_SIZE", 1)
    if local_rank == -1 and world_size <= 1:
        return None
    world_size = max(1, world_size)
    return LaunchLayout(
        world_size=world_size,
        rank=_int(environ, "RANK", 0),
        local_rank=max(0, local_rank),
        local_world_size=max(1, _int(environ, "LOCAL_WORLD_SIZE", world_size)),
        source="torchrun",
        given_node_rank=_int(environ, "GROUP_RANK", _int(environ, "NODE_RANK", -1)),
    )


def _slurm(environ: Mapping[str, str]) -> LaunchLayout | None:
    if "SLURM_NTASKS" not in environ or environ.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return None
    world_size = _int(environ, "SLURM_NTASKS", 1)
    if world_size <= 1:
        return None  # one task: a single process, as the reference sees it
    nodes = max(1, _int(environ, "SLURM_NNODES", _int(environ, "SLURM_JOB_NUM_NODES", 1)))
    # SLURM_NTASKS_PER_NODE is a plain number when --ntasks-per-node is given (Lightning requires it).
    per_node = _int(environ, "SLURM_NTASKS_PER_NODE", max(1, world_size // nodes))
    return LaunchLayout(
        world_size=world_size,
        rank=_int(environ, "SLURM_PROCID", 0),
        local_rank=_int(environ, "SLURM_LOCALID", 0),
        local_world_size=max(1, per_node),
        source="slurm",
        given_node_rank=_int(environ, "SLURM_NODEID", -1),
    )


def launch_layout(environ: Mapping[str, str] | None = None) -> LaunchLayout | None:
    """The layout torchrun's variables describe, else SLURM's, else None (a process nobody launched)."""
    environ = os.environ if environ is None else environ
    return _torchrun(environ) or _slurm(environ)
