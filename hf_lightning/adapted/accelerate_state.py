"""What adapted library code gets for accelerate's process-global state, which hf_lightning never creates.

A library's trainer code sometimes asks accelerate's globals rather than `trainer.accelerator`: TRL's GRPO seeds
each process through `accelerate.utils.set_seed(seed, device_specific=True)`, and TRL's `SyncRefModelCallback`
(`sync_ref_model=True`) reads `AcceleratorState().deepspeed_plugin`. accelerate raises there without an
`Accelerator`, and creating one would set up a second process state beside Lightning's. In the adapted modules'
globals (adapted/registry.py) those names are bound to the stand-ins below, which report this process from the
launcher and torch.distributed, as `trainer.accelerator.state` does before a run.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from hf_lightning.core.seeding import set_seed as seed_everything_the_reference_way


def _distributed() -> Any:
    dist = sys.modules.get("torch.distributed")
    return dist if dist is not None and dist.is_available() and dist.is_initialized() else None


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """accelerate's `set_seed`: `device_specific` adds this process's rank (torch.distributed's, else the
    launcher's `RANK`)."""
    if device_specific:
        seed += AcceleratorState().process_index
    seed_everything_the_reference_way(seed, deterministic=deterministic)


class AcceleratorState:
    """accelerate's `AcceleratorState()` as this process stands: its rank and process count, and no DeepSpeed or
    FSDP plugin (Lightning's strategy runs those; a trainer's own `trainer.accelerator.state` says the same)."""

    @property
    def process_index(self) -> int:
        """This process's global rank."""
        dist = _distributed()
        return dist.get_rank() if dist is not None else int(os.environ.get("RANK", 0))

    @property
    def num_processes(self) -> int:
        """The number of processes."""
        dist = _distributed()
        return dist.get_world_size() if dist is not None else int(os.environ.get("WORLD_SIZE", 1))

    @property
    def local_process_index(self) -> int:
        """This process's rank on its node."""
        return int(os.environ.get("LOCAL_RANK", 0))

    @property
    def is_main_process(self) -> bool:
        """Whether this is the global main process."""
        return self.process_index == 0

    @property
    def deepspeed_plugin(self) -> None:
        """None; under a DeepSpeed run a caller would act on partitioned parameters, which is refused."""
        deepspeed = sys.modules.get("deepspeed")
        comm = getattr(deepspeed, "comm", None)
        if comm is not None and callable(getattr(comm, "is_initialized", None)) and comm.is_initialized():
            raise NotImplementedError(
                "accelerate's AcceleratorState().deepspeed_plugin was asked during a DeepSpeed run: hf_lightning's "
                "DeepSpeed strategy keeps no accelerate plugin, so code gathering ZeRO-3 parameters through it "
                "(e.g. TRL's sync_ref_model) is not supported; set sync_ref_model=False or train without DeepSpeed"
            )
        return None

    @property
    def fsdp_plugin(self) -> None:
        """None: FSDP is configured through `TrainingArguments.fsdp` and run by Lightning's strategy."""
        return None

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"AcceleratorState().{name} has no meaning under hf_lightning (no accelerate state exists); "
            "read trainer.accelerator.state instead"
        )
