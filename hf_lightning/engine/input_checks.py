"""Trainer-construction checks of what needs the model or the data, gathered with the arguments' own.

The arguments are checked again (a field assigned after construction), with the worker options that need
`dataloader_num_workers` > 0 (the reference builds such arguments, its DataLoader refuses them), then what
only the trainer can see:
NEFTune on a model without input embeddings, an empty map-style train dataset, `lr_scheduler_kwargs` the
schedule does not take. Every problem goes into one `InvalidArgumentsError` (a `ValueError`, and also the
type the reference's error has), before any training starts; the reference meets each of them inside
`train()` as an error from torch or its loop.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from hf_lightning.args.validation import Problem, invalid_arguments, value_problems
from hf_lightning.core.enums import enum_value
from hf_lightning.data.model_inputs import unwrap_peft_model
from hf_lightning.data.sized import has_length
from hf_lightning.evaluation.metric_objects import check_metric_object_arguments
from hf_lightning.optim.schedulers import scheduler_kwarg_names

__all__ = [
    "check_neftune_embeddings",
    "check_scheduler_kwargs",
    "check_train_dataset",
    "check_trainer_inputs",
]


def check_neftune_embeddings(model: nn.Module | None, alpha: float | None) -> list[Problem]:
    """`neftune_noise_alpha` adds noise to the output of the model's `get_input_embeddings()` module."""
    if alpha is None or model is None:
        return []
    get_embeddings = getattr(unwrap_peft_model(model), "get_input_embeddings", None)
    try:
        embeddings = get_embeddings() if callable(get_embeddings) else None
    except NotImplementedError:
        embeddings = None
    if isinstance(embeddings, nn.Module):
        return []
    return [
        Problem(
            "neftune_noise_alpha",
            f"{alpha!r} needs a model whose `get_input_embeddings()` returns its embedding module; "
            f"{type(model).__name__} has none. Leave `neftune_noise_alpha` None, or define get_input_embeddings.",
            AttributeError,  # what the reference's train() meets calling the missing method
        )
    ]


def check_train_dataset(dataset: Any) -> list[Problem]:
    """A map-style train dataset must hold at least one sample (an iterable one is checked when iterated)."""
    if dataset is None or not has_length(dataset) or len(dataset) > 0:
        return []
    return [
        Problem(
            "train_dataset",
            f"the {type(dataset).__name__} is empty (len 0): nothing to train on. Pass a dataset with samples.",
        )
    ]


def check_scheduler_kwargs(args: Any, own_scheduler: bool) -> list[Problem]:
    """`lr_scheduler_kwargs` keys must be arguments of the `lr_scheduler_type` schedule (unless one is passed)."""
    kwargs = args.lr_scheduler_kwargs
    if own_scheduler or not kwargs or not isinstance(kwargs, dict):
        return []

    accepted = scheduler_kwarg_names(args.lr_scheduler_type)
    if accepted is None:
        return []
    unknown = [key for key in kwargs if key not in accepted]
    if not unknown:
        return []
    schedule = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    return [
        Problem(
            "lr_scheduler_kwargs",
            f"{unknown} not taken by the {schedule!r} schedule, which takes {accepted}. Remove them, or pick "
            "the `lr_scheduler_type` they belong to.",
            TypeError,  # the schedule function's "unexpected keyword argument" in the reference's train()
        )
    ]


def check_trainer_inputs(
    args: Any, model: nn.Module | None, train_dataset: Any, own_scheduler: bool, neftune_noise_alpha: Any
) -> None:
    """Every problem of the arguments, the model and the train dataset in one `InvalidArgumentsError`."""
    problems = value_problems(args, with_loader_options=True)
    problems += check_neftune_embeddings(model, neftune_noise_alpha)
    problems += check_train_dataset(train_dataset)
    problems += check_scheduler_kwargs(args, own_scheduler)
    if problems:
        raise invalid_arguments("Trainer", problems)


def empty_epoch_error(dataset: Any, epoch: int, global_step: int, max_steps: int) -> ValueError:
    """An iterable train dataset whose epoch yields no batch before `max_steps` (the reference raises too)."""
    return ValueError(
        f"train_dataset: the {type(dataset).__name__} yielded no batch in epoch {epoch} (after {global_step} of "
        f"max_steps={max_steps} updates). Pass an iterable dataset with samples whose __iter__ starts over on "
        "each call, or a smaller `max_steps`."
    )


def check_constructor_arguments(trainer: Any) -> None:
    """The reference's constructor errors (API-1.1.4), same exception types, raised as its constructor raises them
    (before the field-by-field checks of `check_trainer_inputs`)."""
    args = trainer.args
    if trainer.model_init is not None and (trainer.optimizer is not None or trainer.lr_scheduler is not None):
        raise RuntimeError(
            "Passing a `model_init` is incompatible with providing the `optimizers` argument. "
            "You should subclass `Trainer` and override the `create_optimizer_and_scheduler` method."
        )
    if trainer.optimizer_cls_and_kwargs is not None and trainer.optimizer is not None:
        raise RuntimeError(
            "Passing both `optimizers` and `optimizer_cls_and_kwargs` arguments is incompatible."
        )
    if enum_value(args.eval_strategy) != "no" and trainer.eval_dataset is None:
        raise ValueError(
            f"You have set `args.eval_strategy` to {enum_value(args.eval_strategy)} but you didn't pass an "
            "`eval_dataset` to `Trainer`. Either set `args.eval_strategy` to `no` or pass an `eval_dataset`."
        )
    if (
        enum_value(args.save_strategy) == "best" or args.load_best_model_at_end
    ) and args.metric_for_best_model is None:
        raise ValueError(
            "`args.metric_for_best_model` must be provided when using 'best' save_strategy or if "
            "`args.load_best_model_at_end` is set to `True`."
        )
    check_metric_object_arguments(trainer.compute_metrics, args, trainer.get_tp_size())
    if args.batch_eval_metrics and trainer.compute_metrics is not None:
        if "compute_result" not in inspect.signature(trainer.compute_metrics).parameters:
            raise ValueError(
                "When using `batch_eval_metrics`, your `compute_metrics` function must take a `compute_result`"
                " boolean argument which will be triggered after the last batch of the eval set to signal "
                "that the summary statistics should be returned by the function."
            )
    if trainer.train_dataset is not None and not has_length(trainer.train_dataset) and args.max_steps <= 0:
        raise ValueError(
            "The train_dataset does not implement __len__, max_steps has to be specified. "
            "The number of steps needs to be known in advance for the learning rate scheduler."
        )
    if (
        trainer.data_collator is not None
        and not callable(trainer.data_collator)
        and callable(getattr(trainer.data_collator, "collate_batch", None))
    ):
        raise TypeError(
            "The `data_collator` should be a simple callable (function, class with `__call__`)."
        )
