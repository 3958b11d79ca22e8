"""What the strategies read of the trainer: one small protocol per component, naming only the members it uses.

The checkpoint I/O (`checkpoint_io.py` and the classes beside each strategy) reads the run's model, optimizer and
scheduler and calls three of the reference's override points; evaluation's replica count and the tensor-parallel
checks read the process layout; DeepSpeed's engine set-up builds the trainer's own optimizer and schedule; the
strategies that wrap or shard the user's model reach the trainer's parts through our LightningModule and hand what
they built back to it (`HandOverModule`). The facade (`HFLightningTrainer`) satisfies the trainer ports and
`engine/module.py`'s `HFLightningModule` the module port; nothing here imports either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from torch import nn

    from hf_lightning.args.training_args import TrainingArguments
    from hf_lightning.translation.plan import Plan

__all__ = ["CheckpointIOOwner", "HandOverModule", "ProcessLayout", "ScheduleBuilder", "UserParts"]


class ProcessLayout(Protocol):
    """The processes a run spans and how many of them split one model: the arguments' `world_size` and the
    trainer's `get_tp_size()` (a subclass may override it)."""

    args: TrainingArguments

    def get_tp_size(self) -> int: ...


class CheckpointIOOwner(ProcessLayout, Protocol):
    """What the checkpoint I/O reads and calls: the run's plan, model (as trained and as wrapped), optimizer and
    scheduler, and the reference's override points for writing and loading weights."""

    plan: Plan
    model: nn.Module
    model_wrapped: nn.Module
    optimizer: torch.optim.Optimizer | Any  # a LightningOptimizer or the engine's view once training has begun
    lr_scheduler: Any

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None: ...
    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None: ...
    def _issue_warnings_after_load(self, load_result: Any) -> None: ...


class ScheduleBuilder(Protocol):
    """What DeepSpeed's engine set-up calls to give the engine's optimizer the trainer's schedule: the scheduler
    slot and the reference's `create_scheduler` override point."""

    lr_scheduler: Any

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None) -> Any: ...


class UserParts(ScheduleBuilder, Protocol):
    """The trainer's parts a strategy wraps, shards or rebuilds: the arguments, the user's model, the optimizer and
    scheduler passed in (refused where the strategy must build its own), the planned steps, and the reference's
    `create_optimizer` / `create_scheduler` override points DeepSpeed's engine is built with."""

    args: TrainingArguments
    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    state: Any  # callbacks.state.TrainerState: `max_steps`

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer: ...


class HandOverModule(Protocol):
    """Our LightningModule as the wrapping strategies see it: the trainer's parts (`facade`), the module's own
    model, and the hand-overs that put what a strategy built on the trainer (a strategy writes nothing on it)."""

    facade: UserParts
    model: nn.Module

    def adopt_wrapped_model(self, wrapped: nn.Module, *, as_model: bool, fsdp: bool = False) -> None: ...
    def adopt_optimizer_and_scheduler(self, optimizer: Any, scheduler: Any) -> None: ...
    def adopt_engine(self, engine: Any) -> None: ...
