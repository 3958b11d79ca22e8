"""What `trainer.accelerator` reports about the processes and the accumulation window, read from the run.

`DistributedType` has accelerate's member names and string values (a `str` enum), so a comparison with
accelerate's own `DistributedType.MULTI_GPU` (also a `str` enum) holds. The views read the facade each time:
before `train()` the launcher's values in `args` (what accelerate reports from construction), during and after a
run the Lightning strategy's.
"""

from __future__ import annotations

import enum
from typing import Any

import torch

from hf_lightning.engine.protocols import TrainerLike


class DistributedType(str, enum.Enum):
    """accelerate's names for the kind of run (the members Lightning's strategies can be)."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"

    def __str__(self) -> str:
        return self.value


def lightning_strategy(trainer: TrainerLike) -> Any:
    """The strategy of the facade's current (or last) `lightning.Trainer`; None before the first `train()`."""
    lightning_trainer = getattr(trainer, "lightning_trainer", None)
    return None if lightning_trainer is None else lightning_trainer.strategy


def num_processes(trainer: TrainerLike) -> int:
    """Processes of the run: the strategy's world size, else the launcher's (`args.world_size`)."""
    strategy = lightning_strategy(trainer)
    return int(strategy.world_size) if strategy is not None else int(trainer.args.world_size)


def process_index(trainer: TrainerLike) -> int:
    """This process's global rank: the strategy's, else the launcher's (`args.process_index`)."""
    strategy = lightning_strategy(trainer)
    return int(strategy.global_rank) if strategy is not None else int(trainer.args.process_index)


def local_process_index(trainer: TrainerLike) -> int:
    """This process's rank on its node: the strategy's, else the launcher's (`args.local_process_index`)."""
    strategy = lightning_strategy(trainer)
    return int(strategy.local_rank) if strategy is not None else int(trainer.args.local_process_index)


def distributed_type(trainer: TrainerLike) -> DistributedType:
    """accelerate's kind of run for the plan's strategy (NO for a single process, as accelerate reports it)."""
    strategy = trainer.plan.strategy
    name = None if strategy is None else strategy.name
    if name == "deepspeed":
        return DistributedType.DEEPSPEED
    if name in ("fsdp", "fsdp2"):
        return DistributedType.FSDP
    if num_processes(trainer) <= 1:
        return DistributedType.NO
    return DistributedType.MULTI_GPU if trainer.args.device.type == "cuda" else DistributedType.MULTI_CPU


def mixed_precision(trainer: TrainerLike) -> str:
    """The mixed precision, "bf16", "fp16" or "no": the precision the arguments ask for (`bf16` / `fp16`), as accelerate reports it."""
    args = trainer.args
    if getattr(args, "bf16", False):
        return "bf16"
    if getattr(args, "fp16", False):
        return "fp16"
    return "no"


def autocast_dtype(trainer: TrainerLike) -> torch.dtype | None:
    """The dtype the model's forward autocasts to in this run (None: full precision, fp16 on CPU included)."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(trainer.plan.module.forward_autocast)


class AcceleratorStateView:
    """accelerate's `AcceleratorState` as far as it has a meaning here (read-only, from the facade)."""

    def __init__(self, trainer: TrainerLike):
        self._trainer = trainer

    @property
    def device(self) -> torch.device:
        """The device this process computes on (`args.device`)."""
        return self._trainer.args.device

    @property
    def num_processes(self) -> int:
        """Processes of the run."""
        return num_processes(self._trainer)

    @property
    def process_index(self) -> int:
        """This process's global rank."""
        return process_index(self._trainer)

    @property
    def local_process_index(self) -> int:
        """This process's rank on its node."""
        return local_process_index(self._trainer)

    @property
    def distributed_type(self) -> DistributedType:
        """accelerate's kind of run."""
        return distributed_type(self._trainer)

    @property
    def mixed_precision(self) -> str:
        """The mixed precision, "bf16", "fp16" or "no"."""
        return mixed_precision(self._trainer)

    @property
    def use_distributed(self) -> bool:
        """Whether the run is distributed (more than one process)."""
        return self.distributed_type != DistributedType.NO and self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        """Whether this is the global main process."""
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        """Whether this is the main process of its node."""
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        """Whether this is the process with the highest rank."""
        return self.process_index == self.num_processes - 1

    @property
    def deepspeed_plugin(self) -> None:
        """None: DeepSpeed is configured through `TrainingArguments.deepspeed` and run by Lightning's strategy."""
        return None

    @property
    def fsdp_plugin(self) -> None:
        """None: FSDP is configured through `TrainingArguments.fsdp` and run by Lightning's strategy."""
        return None

    @property
    def parallelism_config(self) -> Any:
        """The arguments' `parallelism_config` (None by default: no context / tensor parallelism)."""
        return getattr(self._trainer.args, "parallelism_config", None)

    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type}\nNum processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\nLocal process index: {self.local_process_index}\n"
            f"Device: {self.device}\nMixed precision type: {self.mixed_precision}\n"
        )


class GradientStateView:
    """accelerate's `GradientState`: where the current micro-batch stands in its window and its dataloader.

    `sync_gradients` is whether the micro-batch closes its accumulation window (True outside training);
    `end_of_dataloader` / `remainder` describe the batch being evaluated (the facade's evaluation loop) or, in
    training, the train dataloader's last batch; `remainder` is -1 when unknown or outside a dataloader.
    """

    def __init__(self, trainer: TrainerLike):
        self._trainer = trainer

    @property
    def sync_gradients(self) -> bool:
        """Whether this micro-batch closes its accumulation window (the optimizer steps after it)."""
        run = getattr(self._trainer, "_training_run", None)
        module = None if run is None else getattr(run, "module", None)
        return bool(getattr(module, "sync_gradients", True)) if module is not None else True

    @property
    def num_steps(self) -> int:
        """Micro-batches per update the accelerator itself accumulates: 1, as in the reference's accelerator
        (the trainer accumulates, `gradient_accumulation_steps`)."""
        return 1

    @property
    def in_dataloader(self) -> bool:
        """Whether an evaluation or training dataloader is being iterated."""
        return self._position() is not None

    @property
    def end_of_dataloader(self) -> bool:
        """Whether the current batch is its dataloader's last."""
        position = self._position()
        return bool(position and position[0])

    @property
    def remainder(self) -> int:
        """Real samples of the last batch across processes (accelerate's `len(dataset) % total_batch_size`)."""
        position = self._position()
        return -1 if position is None else int(position[1])

    def _position(self) -> tuple[bool, int] | None:
        trainer = self._trainer
        if getattr(trainer, "_eval_in_loop", False):
            return bool(getattr(trainer, "_eval_on_last_batch", False)), int(
                getattr(trainer, "_eval_last_batch_remainder", -1)
            )
        run = getattr(trainer, "_training_run", None)
        position = getattr(run, "train_dataloader_position", None) if run is not None else None
        return position() if callable(position) else None

    def __repr__(self) -> str:
        return (
            f"Sync Gradients: {self.sync_gradients}\nAt end of current dataloader: {self.end_of_dataloader}\n"
            f"Extra samples added: {self.remainder}\n"
        )
