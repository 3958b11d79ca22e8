"""`AcceleratorOwner`: what `trainer.accelerator` reads of the trainer it belongs to.

The accelerator is built in the trainer's constructor and reads the trainer each time (the launcher's values in
`args` before `train()`, the Lightning strategy's during and after a run), so it keeps the trainer, seen through
this port: the members below and nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from hf_lightning.args.training_args import TrainingArguments
    from hf_lightning.translation.plan import Plan


class AcceleratorOwner(Protocol):
    """The trainer as its accelerator, the state views, the collectives and the prepared dataloaders see it."""

    args: TrainingArguments
    plan: Plan
    lightning_trainer: pl.Trainer | None  # the current (or last) run's; None before the first `train()`
    accelerator: Any  # the trainer's `LightningAccelerator` (a prepared dataloader reads its dealing options)
    callback_handler: Any  # its `eval_dataloader` while an evaluation runs
    _current_evaluation: Any  # evaluation.loop.EvaluationLoop being run, None outside
    _training_run: Any  # engine.training_run.TrainingRun while `train()` runs, None outside

    def get_tp_size(self) -> int: ...
