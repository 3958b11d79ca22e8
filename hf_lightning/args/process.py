"""Process and device properties of ``TrainingArguments``, kept apart from the normalisation code.

A mixin (not a dataclass; it adds no fields). Nothing here sets up accelerate or a process group: the
ranks come from ``torch.distributed`` once it is initialised, else from the launcher's env variables
(``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, or SLURM's under ``srun``: ``hf_lightning/args/launcher.py``),
and the device is derived lazily without initialising CUDA.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
import warnings
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

from hf_lightning.args.declarations import TRAINER_LOG_LEVELS
from hf_lightning.args.launcher import launch_layout
from hf_lightning.core.enums import ParallelMode

logger = logging.getLogger(__name__)

__all__ = ["TrainingArgumentsProcess", "mps_available", "transformers_verbosity"]


def transformers_verbosity(logger_name: str = "transformers") -> int:
    """transformers' current verbosity: its logger's level once imported, else what its import would set."""
    if "transformers" in sys.modules:
        return logging.getLogger(logger_name).getEffectiveLevel()
    env_level = os.environ.get("TRANSFORMERS_VERBOSITY", "")
    level = TRAINER_LOG_LEVELS.get(env_level, -1)
    return level if level > 0 else logging.WARNING


def reference_n_gpu(
    device_type: str, distributed: bool, cuda_device_count: int, deepspeed_launch: bool
) -> int:
    """The reference's `args.n_gpu`: 1 under DeepSpeed and a launcher on any device, a CPU included (its
    DeepSpeed state keeps the initial 1); else 0 on CPU, every visible GPU on one unlaunched CUDA process
    (the reference's DataParallel case) and 1 otherwise. The one rule behind `TrainingArguments.n_gpu` and
    the translation's view of the machine."""
    if deepspeed_launch:
        return 1
    if device_type == "cpu":
        return 0
    if device_type == "cuda" and not distributed:
        return cuda_device_count
    return 1


def cpu_switch_on(environ: Mapping[str, str]) -> bool:
    """Whether accelerate's `ACCELERATE_USE_CPU` switch is on in `environ` (it forces the CPU, as `use_cpu`)."""
    return environ.get("ACCELERATE_USE_CPU", "false").lower() in ("1", "true", "yes", "on")


def _launched() -> bool:
    """Whether a launcher (torchrun, Lightning, mpirun via WORLD_SIZE, srun) started this process."""
    return launch_layout() is not None


def _dist_initialized() -> bool:
    if "torch" not in sys.modules:
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def mps_available() -> bool:
    """Whether torch sees an Apple MPS device (imports torch)."""
    import torch

    mps = getattr(torch.backends, "mps", None)
    return mps is not None and mps.is_available()


class TrainingArgumentsProcess:
    """The process and device properties of the reference's ``TrainingArguments`` (ranks, device,
    ``parallel_mode``, which process logs and saves), read lazily from the launcher's environment.

    Reads the fields ``use_cpu``, ``ddp_timeout``, ``log_on_each_node``, ``save_on_each_node``,
    ``log_level`` and ``log_level_replica`` of the dataclass it is mixed into.
    """

    @property
    def world_size(self) -> int:
        """Number of processes (the launcher's ``WORLD_SIZE``; 1 when not launched)."""
        if _dist_initialized():
            return sys.modules["torch.distributed"].get_world_size()
        layout = launch_layout()
        return layout.world_size if layout is not None else 1

    @property
    def process_index(self) -> int:
        """Global rank of this process."""
        if _dist_initialized():
            return sys.modules["torch.distributed"].get_rank()
        layout = launch_layout()
        return layout.rank if layout is not None else 0

    @property
    def local_process_index(self) -> int:
        """Rank of this process on its node."""
        layout = launch_layout()
        return layout.local_rank if layout is not None else 0

    @property
    def device(self) -> Any:
        """The ``torch.device`` of this process, resolved once (the reference caches it too) without
        initialising CUDA or a process group; the data path reads it for every tensor."""
        resolved = self.__dict__.get("_resolved_device")
        if resolved is None:
            resolved = self.__dict__["_resolved_device"] = self._resolve_device()
        return resolved

    @property
    def _setup_devices(self) -> Any:
        """The reference's device set-up property, read by code that builds a `transformers.Trainer` from these
        arguments (the reference's integrations do when they log the model: `HF_DVCLIVE_LOG_MODEL`,
        `WANDB_LOG_MODEL`); the device, with no process group made."""
        return self.device

    def _cpu_requested(self) -> bool:
        """`use_cpu`, or accelerate's `ACCELERATE_USE_CPU` environment switch (which the reference also reads)."""
        return bool(self.use_cpu) or cpu_switch_on(os.environ)

    def _resolve_device(self) -> Any:
        import torch

        if self._cpu_requested():
            return torch.device("cpu")
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_process_index if self._is_distributed() else 0)
        if mps_available():
            return torch.device("mps")
        return torch.device("cpu")

    @property
    def n_gpu(self) -> int:
        """GPUs used by this process (`reference_n_gpu`)."""
        import torch

        device_type = self.device.type
        return reference_n_gpu(
            device_type,
            distributed=self._is_distributed(),
            cuda_device_count=torch.cuda.device_count() if device_type == "cuda" else 0,
            deepspeed_launch=bool(getattr(self, "deepspeed", None))
            and _launched()
            and not self._cpu_requested(),
        )

    def _is_distributed(self) -> bool:
        return _launched() or (_dist_initialized() and self.world_size > 1)

    @property
    def parallel_mode(self) -> ParallelMode:
        """``tpu`` / ``distributed`` (one process per device) / ``not_distributed`` (DataParallel) / ``not_parallel``."""
        if importlib.util.find_spec("torch_xla") is not None:
            return ParallelMode.TPU
        if self._is_distributed():
            return ParallelMode.DISTRIBUTED
        if self.n_gpu > 1:
            return ParallelMode.NOT_DISTRIBUTED
        return ParallelMode.NOT_PARALLEL

    @property
    def distributed_state(self) -> DistributedStateView:
        """The launcher's processes, accelerate's `PartialState` names (`distributed_type`, ranks, device)."""
        return DistributedStateView(self)

    @property
    def ddp_timeout_delta(self) -> timedelta:
        """``ddp_timeout`` as the ``timedelta`` process-group creation expects."""
        return timedelta(seconds=self.ddp_timeout)

    @property
    def should_log(self) -> bool:
        """Whether this process logs: the main process of each node, or only of node 0."""
        return self.local_process_index == 0 if self.log_on_each_node else self.process_index == 0

    @property
    def should_save(self) -> bool:
        """Whether this process writes checkpoints: the main process of each node, or only of node 0."""
        return self.local_process_index == 0 if self.save_on_each_node else self.process_index == 0

    def get_process_log_level(self) -> int:
        """Log level of this process: ``log_level`` on logging processes, ``log_level_replica`` elsewhere.

        ``passive`` means the current transformers verbosity (30 unless transformers changed it). An
        unknown name raises ``KeyError``, as in the reference.
        """
        main = TRAINER_LOG_LEVELS[self.log_level]
        replica = TRAINER_LOG_LEVELS[self.log_level_replica]
        main = transformers_verbosity() if main == -1 else main
        replica = transformers_verbosity() if replica == -1 else replica
        return main if self.should_log else replica

    @contextlib.contextmanager
    def main_process_first(self, local: bool = True, desc: str = "work") -> Iterator[None]:
        """Run the body on the main process (per node if ``local``) before the other processes run it."""
        if self.world_size <= 1:
            yield
            return
        if not _dist_initialized():
            # The reference's arguments create the process group as they are built; here the first call that
            # needs it does (the group Lightning's strategy reuses later).
            # lazy: torch.distributed only when a multi-process run needs its group; the arguments load no torch
            from hf_lightning.args.process_group import ensure_process_group

            with contextlib.suppress(ValueError):  # no MASTER_ADDR / MASTER_PORT: warned below
                ensure_process_group(self)
        if not _dist_initialized():
            warnings.warn(
                f"main_process_first({desc!r}): the torch.distributed process group is not initialised yet, so "
                "the processes run the body without waiting for each other.",
                stacklevel=3,
            )
            yield
            return
        import torch.distributed as dist

        is_main = self.local_process_index == 0 if local else self.process_index == 0
        try:
            if not is_main:
                logger.debug("%s: waiting for the main process to perform %s", self.process_index, desc)
                dist.barrier()
            yield
        finally:
            if is_main:
                logger.debug(
                    "%s: main process completed %s, releasing all replicas", self.process_index, desc
                )
                dist.barrier()


class DistributedStateView:
    """What the reference's `args.distributed_state` (an accelerate `PartialState`) tells of the launcher's
    processes; `distributed_type` is accelerate's member name as a string ("NO", "MULTI_CPU", "MULTI_GPU",
    "DEEPSPEED"), which compares equal to accelerate's `DistributedType` (a `str` enum)."""

    def __init__(self, args: Any):
        self._args = args

    @property
    def distributed_type(self) -> str:
        """accelerate's kind of run for these arguments and the launcher's processes."""
        args = self._args
        if getattr(args, "deepspeed", None) and args._is_distributed():
            return "DEEPSPEED"
        if not args._is_distributed():
            return "NO"
        return "MULTI_GPU" if args.device.type == "cuda" else "MULTI_CPU"

    @property
    def num_processes(self) -> int:
        """The launcher's process count."""
        return self._args.world_size

    @property
    def process_index(self) -> int:
        """This process's global rank."""
        return self._args.process_index

    @property
    def local_process_index(self) -> int:
        """This process's rank on its node."""
        return self._args.local_process_index

    @property
    def device(self) -> Any:
        """This process's device."""
        return self._args.device

    @property
    def is_main_process(self) -> bool:
        """Whether this is the global main process."""
        return self._args.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        """Whether this is the main process of its node."""
        return self._args.local_process_index == 0
