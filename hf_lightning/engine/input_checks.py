"""Trainer-construction checks of what needs the model or the data, gathered with the arguments' own.

The arguments are checked again (a field assigned after construction), with the worker options that need
`dataloader_num_workers` > 0 (the reference builds such arguments, its DataLoader refuses them), then what
only the trainer can see:
NEFTune on a model without input embeddings, an empty map-style train dataset, `lr_scheduler_kwargs` the
schedule does not take or lacks, `eval_on_start` without eval data, examples the default collator cannot
batch; at `train()` (`check_train_labels`), train examples without the labels the model's loss needs or with
text labels. Every problem goes into one `InvalidArgumentsError` (a `ValueError`, and also the type the reference's
error has), before any training starts; the reference meets each of them inside `train()` as an error from
torch or its loop.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from torch import nn
from torch.utils.data import IterableDataset

from hf_lightning.args.validation import Problem, invalid_arguments, value_problems
from hf_lightning.core.enums import enum_value
from hf_lightning.data.model_inputs import unwrap_peft_model
from hf_lightning.data.sized import has_length
from hf_lightning.evaluation.metric_objects import check_metric_object_arguments
from hf_lightning.optim.schedulers import missing_scheduler_kwargs, scheduler_kwarg_names

if TYPE_CHECKING:
    import torch

    from hf_lightning.args.training_args import TrainingArguments

__all__ = [
    "check_default_collation",
    "check_train_labels",
    "check_eval_on_start",
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


def _shown_example(example: Any, limit: int = 60) -> str:
    text = repr(example)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_example(dataset: Any) -> Any:
    """`dataset[0]`, with the Python, NumPy and torch random states put back afterwards: a dataset that augments
    at random must draw the same numbers in training as it would without this look."""
    import random

    import numpy as np
    import torch

    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            return dataset[0]
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


_LABEL_KEYS = ("label", "label_ids", "labels")  # what the default collators turn into the batch's `labels`


def check_default_collation(name: str, dataset: Any) -> list[Problem]:
    """Examples the default collators cannot batch into model inputs (raw text, a tuple, a dict of text only or of
    text and labels only).

    Checked on the first example of a map-style dataset (read once, the random states kept), when the trainer
    collates with a default collator, its pick or one passed (`default_data_collator`, `DataCollatorWithPadding`):
    both take dicts (or objects with attributes) of numbers, lists or tensors and drop text values, so such
    examples fail at the first step in the reference (`vars() argument must have __dict__ attribute`, or
    `forward() missing ... 'input_ids'`).
    Dropping unused columns only removes keys, so it cannot make such an example collatable.
    """
    if dataset is None or isinstance(dataset, IterableDataset) or not has_length(dataset) or len(dataset) == 0:
        return []
    try:
        example = _first_example(dataset)
    except Exception:  # noqa: BLE001 - a dataset that cannot be indexed so is read by its loader, not judged here
        return []
    try:
        fields = example if isinstance(example, Mapping) else vars(example)
    except TypeError:
        fields = None
    kept = [key for key, value in (fields or {}).items() if value is not None and not isinstance(value, str)]
    if fields is not None and any(key not in _LABEL_KEYS for key in kept):
        return []
    if fields is not None and kept and not any(isinstance(value, str) for value in fields.values()):
        return []  # labels and nothing else, no text: a data set of its own kind (the model's error stays its own)
    kind = "text" if isinstance(example, (str, bytes)) else f"a {type(example).__name__}"
    if fields is None:
        what = f"{kind}, not a dict of model inputs"
    elif kept:
        what = (
            f"{kind} of text and labels, with no model inputs (text values are dropped, or refused by the "
            "tokenizer's `pad`, leaving labels alone)"
        )
    else:
        what = f"{kind} with no model inputs (text values are dropped by the collator, leaving an empty batch)"
    return [
        Problem(
            name,
            f"{name}[0] = {_shown_example(example)} is {what}. Tokenize the examples first (for example "
            "`dataset.map(lambda row: tokenizer(row['text']))`, keeping `labels`), or pass a `data_collator` "
            "that turns a list of them into a batch of tensors.",
        )
    ]


def check_train_labels(dataset: Any, label_names: list[str] | None, model: Any, loss_needs_labels: bool) -> list[Problem]:
    """The first train example, as the default collator will batch it: labels given as text (the collator's
    `torch.tensor` fails with "too many dimensions 'str'"), or, when the model's loss needs labels
    (`loss_needs_labels`), none of the label columns (the model returns no loss: "The model did not return a loss
    from the inputs" at the first step). Read once, the random states kept; iterable datasets are not read."""
    if dataset is None or isinstance(dataset, IterableDataset) or not has_length(dataset) or len(dataset) == 0:
        return []
    try:
        example = _first_example(dataset)
        fields = example if isinstance(example, Mapping) else vars(example)
    except Exception:  # noqa: BLE001 - not a dict of columns: check_default_collation speaks of it
        return []
    problems = []
    for key in _LABEL_KEYS:
        value = fields.get(key)
        as_list = value if isinstance(value, (list, tuple)) else [value]
        if as_list and all(isinstance(item, str) for item in as_list):
            problems.append(
                Problem(
                    "train_dataset",
                    f"train_dataset[0][{key!r}] = {_shown_example(value)} is text; the collator makes a tensor of "
                    f"class ids from it. Map the labels to ids first (datasets: "
                    f"`dataset.class_encode_column({key!r})`, or `dataset.map(lambda row: {{{key!r}: ids[row[{key!r}]]}})`"
                    " with `ids = {'negative': 0, ...}`) and give the model `num_labels` and `id2label`.",
                )
            )
    names = list(label_names or [])
    present = set(fields) | ({"labels"} if any(key in fields for key in _LABEL_KEYS) else set())
    if loss_needs_labels and names and not any(name in present for name in names):
        problems.append(
            Problem(
                "train_dataset",
                f"train_dataset[0] has no {' / '.join(repr(name) for name in names)} column (its columns: "
                f"{sorted(fields)}), so {type(model).__name__} returns no loss and training would stop at its first "
                "step. Add the labels to the dataset (for classification a 'label' column of class ids), name the "
                "column that holds them with `label_names=[...]`, or pass a `data_collator` or `compute_loss_func` "
                "that provides them.",
            )
        )
    return problems


def check_scheduler_kwargs(args: Any, own_scheduler: bool) -> list[Problem]:
    """`lr_scheduler_kwargs` keys must be arguments of the `lr_scheduler_type` schedule, and hold the ones it needs
    (`warmup_stable_decay`'s `num_decay_steps`, `cosine_with_min_lr`'s `min_lr` or `min_lr_rate`), unless the
    trainer was given its own scheduler."""
    kwargs = args.lr_scheduler_kwargs
    if own_scheduler or not isinstance(kwargs, (dict, type(None))):
        return []  # a str that is no JSON object is refused with the arguments' values (args/validation.py)
    kwargs = kwargs or {}
    schedule = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    problems = []
    accepted = scheduler_kwarg_names(args.lr_scheduler_type)
    unknown = [key for key in kwargs if accepted is not None and key not in accepted]
    if unknown:
        problems.append(
            Problem(
                "lr_scheduler_kwargs",
                f"{unknown} not taken by the {schedule!r} schedule, which takes {accepted}. Remove them, or pick "
                "the `lr_scheduler_type` they belong to.",
                TypeError,  # the schedule function's "unexpected keyword argument" in the reference's train()
            )
        )
    missing = missing_scheduler_kwargs(args.lr_scheduler_type, kwargs)
    if missing:
        example = ", ".join(f"{key.split(' or ')[0]!r}: ..." for key in missing)
        problems.append(
            Problem(
                "lr_scheduler_kwargs",
                f"the {schedule!r} schedule needs {' and '.join(repr(key) for key in missing)}, which "
                f"lr_scheduler_kwargs={args.lr_scheduler_kwargs!r} lacks: pass lr_scheduler_kwargs={{{example}}}.",
                TypeError,  # the schedule function's "missing 1 required positional argument" in train()
            )
        )
    return problems


def check_eval_on_start(args: Any, eval_dataset: Any) -> list[Problem]:
    """`eval_on_start` evaluates before the first update: it needs the eval data (as `eval_strategy` does)."""
    if not args.eval_on_start or eval_dataset is not None:
        return []
    return [
        Problem(
            "eval_on_start",
            "True evaluates before the first update, but the Trainer has no eval_dataset: pass eval_dataset, "
            "or leave eval_on_start False.",
        )
    ]


def check_trainer_inputs(
    args: Any,
    model: nn.Module | None,
    train_dataset: Any,
    own_scheduler: bool,
    neftune_noise_alpha: Any,
    eval_dataset: Any = None,
    default_collator: bool = False,
) -> None:
    """Every problem of the arguments, the model and the datasets in one `InvalidArgumentsError`;
    `default_collator`: the trainer collates with a default collator, its own pick or one passed as `data_collator`
    (`hf_lightning.data.collate.collates_as_a_default`)."""
    problems = value_problems(args, with_loader_options=True)
    problems += check_neftune_embeddings(model, neftune_noise_alpha)
    problems += check_train_dataset(train_dataset)
    if default_collator:
        problems += check_default_collation("train_dataset", train_dataset)
        eval_sets = eval_dataset if isinstance(eval_dataset, dict) else {"": eval_dataset}
        for key, dataset in eval_sets.items():
            problems += check_default_collation(f"eval_dataset[{key!r}]" if key else "eval_dataset", dataset)
    problems += check_scheduler_kwargs(args, own_scheduler)
    problems += check_eval_on_start(args, eval_dataset)
    if problems:
        raise invalid_arguments("Trainer", problems)


def empty_epoch_error(dataset: Any, epoch: int, global_step: int, max_steps: int) -> ValueError:
    """An iterable train dataset whose epoch yields no batch before `max_steps` (the reference raises too)."""
    return ValueError(
        f"train_dataset: the {type(dataset).__name__} yielded no batch in epoch {epoch} (after {global_step} of "
        f"max_steps={max_steps} updates). Pass an iterable dataset with samples whose __iter__ starts over on "
        "each call, or a smaller `max_steps`."
    )


class ConstructorArguments(Protocol):
    """The trainer's constructor arguments as the reference's constructor checks read them."""

    args: TrainingArguments
    model_init: Any
    optimizer: torch.optim.Optimizer | None
    lr_scheduler: Any
    optimizer_cls_and_kwargs: Any
    train_dataset: Any
    eval_dataset: Any
    data_collator: Any
    compute_metrics: Any

    def get_tp_size(self) -> int: ...


def check_constructor_arguments(trainer: ConstructorArguments) -> None:
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
    check_metric_object_arguments(
        trainer.compute_metrics,
        getattr(args, "batch_eval_metrics", False),
        getattr(args, "include_for_metrics", None),
        trainer.get_tp_size(),
    )
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
