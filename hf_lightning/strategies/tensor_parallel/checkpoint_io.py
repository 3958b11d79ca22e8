"""Checkpoint files of a tensor-parallel run: the reference's one-process files, gathered from and sliced into the
DTensor shards, so a tensor-parallel checkpoint resumes on one process and the other way round."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from hf_lightning.core.checkpoint_files import OPTIMIZER_NAME
from hf_lightning.strategies.checkpoint_io import StrategyCheckpointIO, plain_optimizer
from hf_lightning.strategies.tensor_parallel.shards import (
    full_optimizer_state,
    full_state_dict,
    is_tp_sharded,
    load_full_optimizer_state,
    load_full_state_dict,
    trainer_tp_size,
)

if TYPE_CHECKING:
    from hf_lightning.strategies.ports import CheckpointIOOwner


def holds_shards(trainer: CheckpointIOOwner) -> bool:
    """Whether the trainer's model holds DTensor shards of its tensor-parallel plan (before the first `train()` it
    is still the plain model, saved and loaded as such)."""
    return trainer_tp_size(trainer) > 1 and is_tp_sharded(trainer.model)


class TensorParallelCheckpointIO(StrategyCheckpointIO):
    """Full weights and optimizer state on disk; shards in memory."""

    supports_background_writes = False  # saving gathers the shards across ranks

    def _load_state_dict(self, model: Any, state_dict: dict) -> Any:
        if is_tp_sharded(model):  # a later train() call, or the best model: the full weights sliced like the shards
            return load_full_state_dict(model, state_dict)
        return super()._load_state_dict(model, state_dict)

    def _load_optimizer_state(self, model: Any, optimizer: Any, state: dict[str, Any]) -> None:
        if not is_tp_sharded(model):
            super()._load_optimizer_state(model, optimizer, state)
            return
        load_full_optimizer_state(plain_optimizer(optimizer), state)

    def save_optimizer_and_scheduler(self, trainer: CheckpointIOOwner, output_dir: str, reach: Any) -> None:
        """All ranks gather the optimizer shards; the saving rank writes a one-process `optimizer.pt`."""
        if not holds_shards(trainer):
            super().save_optimizer_and_scheduler(trainer, output_dir, reach)
            return
        optimizer_state = full_optimizer_state(trainer.optimizer)
        if not trainer.args.should_save:
            return
        reach("optimizer")
        torch.save(optimizer_state, os.path.join(output_dir, OPTIMIZER_NAME))
        self._save_scheduler(trainer.lr_scheduler, output_dir, reach)

    def save_model(self, trainer: CheckpointIOOwner, output_dir: str, in_checkpoint: bool = False) -> None:
        """All ranks gather the shards; the saving rank writes the full weights."""
        if holds_shards(trainer):
            trainer._save(output_dir, state_dict=full_state_dict(trainer.model))
        else:
            trainer._save(output_dir)
