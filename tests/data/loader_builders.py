"""The train and eval DataLoaders the facade builds, made from a `DataContext` alone, for the data layer's tests.

What the facade's `get_train_dataloader` / `get_eval_dataloader` compose (trainer/data_methods.py): the reference's
sampler for the split, then `dataloaders.build_dataloader` (column removal, collation, this process's share)."""

from __future__ import annotations

import functools
from typing import Any

from hf_lightning.data.context import DataContext
from hf_lightning.data.dataloaders import HFDataLoader, build_dataloader
from hf_lightning.data.model_inputs import get_eval_sampler, get_train_sampler
from hf_lightning.translation.translate import translate


def context_without_trainer(*, args: Any, **fields: Any) -> DataContext:
    """A `DataContext` for arguments no trainer has planned: the plan's module settings are translated here, in the
    open (a trainer passes its own plan's)."""
    return DataContext(args=args, settings=translate(args, raise_on_refusal=False).module, **fields)


def build_train_dataloader(
    dataset: Any, context: DataContext, *, seed_for_sampler: int | None = None, batch_size: int | None = None
) -> HFDataLoader:
    """This process's train DataLoader, as the reference's `get_train_dataloader` + accelerate prepare."""
    if dataset is None:
        raise ValueError("Trainer: training requires a train_dataset.")
    make_sampler = functools.partial(
        get_train_sampler,
        args=context.args,
        processing_class=context.processing_class,
        world_size=context.world_size,
        process_index=context.process_index,
        seed_for_sampler=seed_for_sampler,
        settings=context.settings,
    )
    return build_dataloader(
        dataset,
        make_sampler,
        context,
        batch_size=batch_size if batch_size is not None else context.args.train_batch_size,
        description="Training",
        is_training=True,
    )


def build_eval_dataloader(dataset: Any, context: DataContext, *, description: str = "Evaluation") -> HFDataLoader:
    """This process's eval (or, with `description="test"`, test) DataLoader, as the reference builds it."""
    if dataset is None:
        raise ValueError("Trainer: evaluation requires an eval_dataset.")
    make_sampler = functools.partial(
        get_eval_sampler, args=context.args, processing_class=context.processing_class, world_size=context.world_size
    )
    return build_dataloader(
        dataset, make_sampler, context, batch_size=context.args.eval_batch_size, description=description
    )
