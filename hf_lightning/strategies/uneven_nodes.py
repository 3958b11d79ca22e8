"""Nodes holding different process counts (e.g. 2 + 1): the process described to Lightning by the launcher's values.

Lightning describes a run as `devices` processes on each of `num_nodes` nodes: its TorchElasticEnvironment refuses a
world size that is not their product, and its LightningEnvironment (what Ray Train's processes get) computes the
global rank as `node_rank * devices + local_rank` and the world size as `num_nodes * devices`, both wrong there. A
process whose layout that product cannot describe gets `LaunchedProcessEnvironment`, which reads the world size, the
global, local and node ranks the launcher gave it (torchrun's agents, Ray Train's `TorchConfig`) and never derives them.
"""

from __future__ import annotations

import os
from typing import Any

from lightning.fabric.plugins.environments import ClusterEnvironment

from hf_lightning.args.launcher import LaunchLayout, launch_layout

__all__ = ["LaunchedProcessEnvironment", "described_by_product", "environment_for_layout", "launched_world_size"]


def described_by_product(layout: LaunchLayout, devices: int, num_nodes: int) -> bool:
    """Whether Lightning's `devices` x `num_nodes` gives this process's world size and global rank."""
    return devices * num_nodes == layout.world_size and layout.node_rank * devices + layout.local_rank == layout.rank


class LaunchedProcessEnvironment(ClusterEnvironment):
    """A process another launcher started, described by that launcher's world size and ranks (never derived)."""

    def __init__(self, layout: LaunchLayout) -> None:
        self._layout = layout

    @property
    def creates_processes_externally(self) -> bool:
        """The launcher started every process; Lightning starts none."""
        return True

    @property
    def main_address(self) -> str:
        """The rendezvous address the launcher set (torchrun and Ray Train set MASTER_ADDR)."""
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        """The rendezvous port the launcher set."""
        return int(os.environ.get("MASTER_PORT", "12910"))

    @staticmethod
    def detect() -> bool:
        """Never chosen by Lightning itself: `environment_for_layout` decides."""
        return False

    def world_size(self) -> int:
        """All processes of the run, over every node."""
        return self._layout.world_size

    def set_world_size(self, size: int) -> None:
        """Ignored: Lightning would set `num_nodes * devices`, which is not the run's world size here."""

    def global_rank(self) -> int:
        """This process's rank in the run, as the launcher numbered it."""
        return self._layout.rank

    def set_global_rank(self, rank: int) -> None:
        """Ignored: Lightning would set `node_rank * devices + local_rank`, wrong after a node of another size."""

    def local_rank(self) -> int:
        """This process's rank on its node."""
        return self._layout.local_rank

    def node_rank(self) -> int:
        """This process's node, as the launcher indexed it."""
        return self._layout.node_rank

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """ValueError unless Lightning's `devices` are this node's processes (the product is not checked)."""
        if num_devices != self._layout.local_world_size:
            raise ValueError(
                f"Lightning devices={num_devices}, but the launcher started {self._layout.local_world_size} "
                f"process(es) on this node (LOCAL_WORLD_SIZE): the devices come from the launcher, do not set them."
            )


def environment_for_layout(layout: LaunchLayout | None, devices: int, num_nodes: int) -> ClusterEnvironment | None:
    """`LaunchedProcessEnvironment` for a launched process that `devices` x `num_nodes` cannot describe (its node
    holds another process count than some other node); None where Lightning's own environment describes it. SLURM
    stays with Lightning's SLURMEnvironment (its requeue), which needs the same `--ntasks-per-node` on every node."""
    if layout is None or layout.source != "torchrun" or described_by_product(layout, devices, num_nodes):
        return None
    return LaunchedProcessEnvironment(layout)


def launched_world_size(plan: Any) -> int:
    """The run's processes: the launcher's world size when the plan runs several, else the plan's devices x nodes
    (the two differ only when nodes hold different process counts)."""
    product = plan.lightning.devices * plan.lightning.num_nodes
    layout = launch_layout()
    return layout.world_size if layout is not None and product > 1 else product
