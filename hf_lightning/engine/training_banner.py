"""The reference's "***** Running training *****" banner, logged when `train()` starts training.

Its lines, text and fields are the reference's `_inner_training_loop`'s (examples, epochs, updates per epoch,
batch sizes, accumulation, total updates, trainable parameters, and where a resume continues), on the
reference's logger when transformers is loaded (hf_lightning/core/reference_logging.py). `log_level="info"`
shows it; the default level does not, as in the reference. A resume is also said in one line that every log level
shows (`resumed_from_line`), so the progress bar's jump to the resumed step is explained.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Protocol

from hf_lightning.core.reference_logging import reference_logger

if TYPE_CHECKING:
    from torch import nn

    from hf_lightning.args.training_args import TrainingArguments
    from hf_lightning.callbacks import TrainerState
    from hf_lightning.translation.plan import Plan


class BannerSource(Protocol):
    """The trainer as the banner sees it: the arguments, the plan, the model, the state and the batch size used."""

    args: TrainingArguments
    plan: Plan
    model: nn.Module
    state: TrainerState
    _train_batch_size: int  # `auto_find_batch_size` may have shrunk it


def trainable_parameter_count(model: Any) -> int:
    """The reference's `get_model_param_count(model, trainable_only=True)` (DeepSpeed ZeRO-3 keeps `ds_numel`)."""
    return sum(
        getattr(parameter, "ds_numel", None) or parameter.numel()
        for parameter in model.parameters()
        if parameter.requires_grad
    )


def log_training_banner(trainer: BannerSource, values: Any, resume_point: Any | None) -> None:
    """Log the banner for the run's `TrainingValues` and, when resuming, its `ResumePoint`."""
    logger = reference_logger("transformers.trainer", __name__)
    per_device = trainer.args.per_device_train_batch_size
    logger.info("***** Running training *****")
    logger.info(f"  Num examples = {values.num_examples:,}")
    logger.info(f"  Num Epochs = {values.num_train_epochs:,}")
    logger.info(f"  Num update steps per epoch = {values.num_update_steps_per_epoch:,}")
    logger.info(f"  Instantaneous batch size per device = {per_device:,}")
    if per_device != trainer._train_batch_size:  # auto_find_batch_size shrank it (the reference's wording)
        logger.info(f"  Training with DataParallel so batch size has been adjusted to: {trainer._train_batch_size:,}")
    logger.info(f"  Total train batch size (w. parallel, distributed & accumulation) = {values.total_train_batch_size:,}")
    logger.info(f"  Gradient Accumulation steps = {trainer.plan.module.gradient_accumulation_steps}")
    logger.info(f"  Total optimization steps = {values.max_steps:,}")
    logger.info(f"  Number of trainable parameters = {trainable_parameter_count(trainer.model):,}")
    if resume_point is None:
        return
    logger.info(
        f"  Resuming training from checkpoint with epoch {resume_point.epochs_trained} and global step "
        f"{trainer.state.global_step}"
    )
    if not trainer.plan.checkpointing.ignore_data_skip:
        logger.info(
            f"  Fast-forwarding the dataloader past {resume_point.epochs_trained} epochs and"
            f" {resume_point.steps_trained_in_current_epoch} batches to resume from the exact training state."
        )
    if trainer.args.process_index == 0:
        print(resumed_from_line(trainer, values, resume_point), file=sys.stderr, flush=True)


def resumed_from_line(trainer: BannerSource, values: Any, resume_point: Any) -> str:
    """Where a resumed run continues, in one line: the checkpoint, the step of the total, the epoch and the batches
    of it already trained (skipped, not trained again)."""
    where = f"epoch {resume_point.epochs_trained}"
    if trainer.plan.checkpointing.ignore_data_skip:
        where += ", its data from the start (ignore_data_skip=True)"
    elif resume_point.steps_trained_in_current_epoch:
        where += f", after its first {resume_point.steps_trained_in_current_epoch} batches"
    return (
        f"hf_lightning: resuming from {resume_point.files.checkpoint} at step {trainer.state.global_step} of "
        f"{values.max_steps} ({where})"
    )
