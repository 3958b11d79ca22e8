"""Step and epoch arithmetic of the reference Trainer, as pure functions.

Everything here counts optimizer updates ("steps") and micro-batches the way the reference does
(R2.1-R2.10), so the facade and the LightningModule never re-derive these numbers.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass


def updates_per_epoch(len_dataloader: int, gradient_accumulation_steps: int) -> int:
    """Optimizer updates in one epoch: a short last window still makes a full update (R2.1)."""
    return max(math.ceil(len_dataloader / gradient_accumulation_steps), 1)


def last_window_size(steps_in_epoch: int, gradient_accumulation_steps: int) -> int:
    """Micro-batches in the last window of an epoch (R2.1)."""
    remainder = steps_in_epoch % gradient_accumulation_steps
    return remainder if remainder else gradient_accumulation_steps


def window_size(update_index: int, num_update_steps_per_epoch: int, steps_in_epoch: int, ga: int) -> int:
    """Micro-batches the reference pulls for the 0-based update `update_index` of an epoch (R2.5)."""
    if update_index != num_update_steps_per_epoch - 1:
        return ga
    return last_window_size(steps_in_epoch, ga)


def is_sync_step(micro_batch_index: int, steps_in_epoch: int, ga: int) -> bool:
    """Whether the optimizer steps after micro-batch `micro_batch_index` (0-based in the epoch, R2.5)."""
    return (micro_batch_index + 1) % ga == 0 or (micro_batch_index + 1) == steps_in_epoch


def epoch_float(epoch_index: int, micro_batch_index: int, steps_in_epoch: int) -> float:
    """`state.epoch` after an update that consumed micro-batch `micro_batch_index` (R2.6)."""
    return epoch_index + (micro_batch_index + 1) / steps_in_epoch


@dataclass(frozen=True)
class TrainingValues:
    """The seven values of the reference's `set_initial_training_values`, in its order."""

    num_train_epochs: int
    num_update_steps_per_epoch: int
    num_examples: int
    num_train_samples: float
    total_train_batch_size: int
    steps_in_epoch: int
    max_steps: int

    def as_tuple(self) -> tuple:
        return (
            self.num_train_epochs,
            self.num_update_steps_per_epoch,
            self.num_examples,
            self.num_train_samples,
            self.total_train_batch_size,
            self.steps_in_epoch,
            self.max_steps,
        )


def initial_training_values(
    *,
    max_steps_arg: int,
    num_train_epochs_arg: float,
    gradient_accumulation_steps: int,
    len_dataloader: int | None,
    num_examples_in_loader: int | None,
    total_train_batch_size: int,
) -> TrainingValues:
    """Resolve epochs, updates per epoch, sample counts and `max_steps` (R2.2, R2.3, R2.4, R2.8).

    `len_dataloader` is None for a loader without a working `len` (then `max_steps_arg` must be > 0).
    """
    ga = gradient_accumulation_steps
    max_steps = max_steps_arg
    if len_dataloader is not None:
        upe = updates_per_epoch(len_dataloader, ga)
        if max_steps_arg <= 0:
            max_steps = math.ceil(num_train_epochs_arg * upe)
    if len_dataloader:
        num_examples = int(num_examples_in_loader or 0)
        if max_steps_arg > 0:
            num_train_epochs = math.ceil(max_steps / upe)
            num_train_samples: float = max_steps * total_train_batch_size
        else:
            num_train_epochs = math.ceil(num_train_epochs_arg)
            num_train_samples = num_examples * num_train_epochs_arg
    elif max_steps_arg > 0:
        num_train_epochs = sys.maxsize
        upe = max_steps
        num_examples = total_train_batch_size * max_steps_arg
        num_train_samples = max_steps_arg * total_train_batch_size
    else:
        raise ValueError(
            "args.max_steps must be set to a positive value if dataloader does not have a length, was"
            f" {max_steps_arg}"
        )
    steps_in_epoch = len_dataloader if len_dataloader is not None else max_steps * ga
    return TrainingValues(
        num_train_epochs=num_train_epochs,
        num_update_steps_per_epoch=upe,
        num_examples=num_examples,
        num_train_samples=num_train_samples,
        total_train_batch_size=total_train_batch_size,
        steps_in_epoch=steps_in_epoch,
        max_steps=max_steps,
    )


def resolve_ratio_steps(value: float, max_steps: int) -> int | float:
    """A logging/eval/save step value below 1 is a ratio of `max_steps`, rounded up (R2.9)."""
    if value is not None and value < 1:
        return math.ceil(max_steps * value)
    return value
