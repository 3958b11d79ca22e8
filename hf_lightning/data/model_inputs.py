"""What the reference reads from the model and the data before it builds a DataLoader (R3.1, R3.11, R3.12).

Covers label-name inference (R3.12), `forward`-signature columns and column removal (R3.11) and the
sampler choice (R3.1). The DataLoaders themselves are built in `dataloaders.py`. transformers, accelerate and datasets are never imported here.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import (
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from hf_lightning.data.collate import RemoveColumnsCollator, ignored_columns_message
from hf_lightning.data.samplers import (
    BatchRebalanceSampler,
    LengthGroupedSampler,
    SeedableRandomSampler,
    lengths_from_items,
)
from hf_lightning.data.sized import has_length
from hf_lightning.translation.plan import ModuleSettings

logger = logging.getLogger(__name__)



# ---- model introspection ---------------------------------------------------------------------------------


def is_peft_model(model: Any) -> bool:
    """Whether `model` is a PEFT wrapper (`PeftModel` / `PeftMixedModel`), the reference's test."""
    peft = sys.modules.get("peft")  # a PEFT model can only exist once peft is imported
    wrappers = tuple(getattr(peft, name) for name in ("PeftModel", "PeftMixedModel") if hasattr(peft, name))
    return bool(wrappers) and isinstance(model, wrappers)


def unwrap_peft_model(model: Any) -> Any:
    """The base model of a PEFT wrapper (whose `forward` decides labels and columns); others unchanged."""
    if not is_peft_model(model):
        return model
    if hasattr(model, "get_base_model"):
        return model.get_base_model()
    if hasattr(model, "base_model") and hasattr(model.base_model, "model"):
        return model.base_model.model  # PeftMixedModel has no get_base_model
    raise AttributeError("Cannot extract base model safely from this PEFT wrapper.")


def _unwrap_engine_wrappers(model: Any) -> Any:
    # What accelerate's `unwrap_model` removes before the reference inspects `forward`: DDP /
    # DataParallel (`.module`) and torch.compile (`._orig_mod`).
    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod") and type(model).__name__ == "OptimizedModule":
            model = model._orig_mod
        else:
            return model


def infer_label_names(model: Any) -> list[str]:
    """Default `label_names`: `forward` parameters containing "label" (plus start/end positions for QA)."""
    model_class = type(unwrap_peft_model(model))
    parameters = inspect.signature(model_class.forward).parameters
    if "QuestionAnswering" in model_class.__name__:
        return [p for p in parameters if "label" in p or p in ("start_positions", "end_positions")]
    return [p for p in parameters if "label" in p]


def can_return_loss(model: Any) -> bool:
    """True when the model class's `forward` has `return_loss` defaulting to True."""
    parameters = inspect.signature(type(unwrap_peft_model(model)).forward).parameters
    return "return_loss" in parameters and parameters["return_loss"].default is True


def model_accepts_loss_kwargs(model: Any) -> bool:
    """The model's `accepts_loss_kwargs` attribute if present, else whether `forward` takes `**kwargs` (R4.6)."""
    unwrapped = unwrap_peft_model(_unwrap_engine_wrappers(model))
    if hasattr(unwrapped, "accepts_loss_kwargs"):
        return unwrapped.accepts_loss_kwargs
    parameters = inspect.signature(unwrapped.forward).parameters.values()
    return any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters)


def resolve_label_names(args: Any, model: Any) -> list[str]:
    """`args.label_names` when set, else the names inferred from the model class."""
    return list(args.label_names) if args.label_names is not None else infer_label_names(model)


# ---- column removal --------------------------------------------------------------------------------------


def signature_columns(model: Any, label_names: list[str]) -> list[str]:
    """Names a batch may carry: `forward`'s parameters (a `**kwargs` name included) plus the label keys."""
    columns = list(inspect.signature(unwrap_peft_model(model).forward).parameters.keys())
    # The reference dedups through a set, so the order of these trailing names is not stable.
    return columns + list(set(["label", "label_ids"] + list(label_names)))


def is_datasets_dataset(dataset: Any) -> bool:
    """True for a `datasets.Dataset` (checked without importing datasets)."""
    datasets_module = sys.modules.get("datasets")
    return datasets_module is not None and isinstance(dataset, datasets_module.Dataset)


def remove_unused_columns(
    dataset: Any, columns: list[str], description: str | None = None, model_name: str | None = None
) -> Any:
    """A copy of the `datasets.Dataset` without the columns `forward` does not take (R3.11)."""
    ignored_columns = list(set(dataset.column_names) - set(columns))
    if ignored_columns:
        logger.info(ignored_columns_message(ignored_columns, model_name or "model", description))
    if not any(k in dataset.column_names for k in columns):
        raise ValueError(
            "No columns in the dataset match the model's forward method signature: "
            f"({', '.join(columns)}). The following columns have been ignored: [{', '.join(ignored_columns)}]. "
            "Please check the dataset and model. You may need to set `remove_unused_columns=False` in "
            "`TrainingArguments`."
        )
    return dataset.remove_columns(ignored_columns)


def apply_column_removal(
    dataset: Any, data_collator: Callable, *, args: Any, model: Any, description: str,
    columns: list[str] | None = None,
) -> tuple[Any, Callable]:
    """With `remove_unused_columns`, drop the columns `forward` does not take (R3.11): from a
    `datasets.Dataset` itself, else by wrapping the collator; otherwise both are returned unchanged.

    `columns`: the columns to keep, as a trainer's `_set_signature_columns_if_needed` chose them (a subclass
    may keep more, e.g. TRL's `seq_lengths`); `forward`'s signature and the label names when not given."""
    if not args.remove_unused_columns:
        return dataset, data_collator
    if columns is None:
        columns = signature_columns(model, resolve_label_names(args, model))
    model_name = type(model).__name__
    if is_datasets_dataset(dataset):
        return remove_unused_columns(dataset, columns, description, model_name), data_collator
    wrapped = RemoveColumnsCollator(
        data_collator, columns, logger, model_name=model_name, description=description
    )
    return dataset, wrapped


# ---- samplers ---------------------------------------------------------------------------------------------


def _length_column(dataset: Any, args: Any) -> list[int] | None:
    if is_datasets_dataset(dataset) and args.length_column_name in dataset.column_names:
        return list(dataset[args.length_column_name])
    return None


def _model_input_name(processing_class: Any) -> str | None:
    return processing_class.model_input_names[0] if processing_class is not None else None


def _is_dict_like_item(item: Any) -> bool:
    # batch_rebalance accepts dicts and transformers' BatchEncoding (a UserDict), not any Mapping.
    return isinstance(item, dict) or any(c.__name__ == "BatchEncoding" for c in type(item).__mro__)


def get_train_sampler(
    dataset: Any,
    *,
    args: Any,
    processing_class: Any = None,
    world_size: int = 1,
    process_index: int = 0,
    seed_for_sampler: int | None = None,
    settings: ModuleSettings,
) -> Sampler | None:
    """The reference's train sampler for `args.train_sampling_strategy` (R3.1); None for unsized data.

    The random order is seeded with `data_seed`, else `seed_for_sampler`, else `torch.initial_seed()`
    read now (the reference reads it when the train loader is built). `settings`: the trainer's plan's module section.
    """
    strategy = args.train_sampling_strategy
    if not has_length(dataset):
        if strategy in ("group_by_length", "batch_rebalance"):
            logger.warning(
                f"`train_sampling_strategy='{strategy}'` is ignored because the training dataset does not "
                "implement `__len__` (e.g. an `IterableDataset`). Examples will be consumed in the dataset's "
                "own order."
            )
        return None
    if strategy == "group_by_length":
        return LengthGroupedSampler(
            args.train_batch_size * settings.gradient_accumulation_steps,
            dataset=dataset,
            lengths=_length_column(dataset, args),
            model_input_name=_model_input_name(processing_class),
        )
    if strategy == "batch_rebalance":
        lengths = _length_column(dataset, args)
        if lengths is None:
            model_input_name = _model_input_name(processing_class) or "input_ids"
            if not _is_dict_like_item(dataset[0]) or model_input_name not in dataset[0]:
                raise ValueError(
                    "Can only automatically infer lengths for datasets whose items are dictionaries with an "
                    f"'{model_input_name}' key."
                )
            lengths = lengths_from_items(dataset, model_input_name)
        world_size = max(1, world_size)
        return BatchRebalanceSampler(
            lengths=lengths,
            effective_batch_size=args.train_batch_size * settings.gradient_accumulation_steps * world_size,
            dp_size=world_size,
            grad_accum=settings.gradient_accumulation_steps,
            rank=process_index if world_size > 1 else 0,
            drop_last=args.dataloader_drop_last,
        )
    if strategy == "sequential":
        return SequentialSampler(dataset)
    # "random" and any other string, as in the reference.
    if settings.use_seedable_sampler:
        seed = args.data_seed if args.data_seed is not None else seed_for_sampler
        return SeedableRandomSampler(dataset, seed=seed)
    if world_size > 1:
        # accelerate attaches a generator seeded by one draw of the global RNG when preparing the loader.
        generator = torch.Generator(device=torch.get_default_device())
        generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        return RandomSampler(dataset, generator=generator)
    return RandomSampler(dataset)  # draws a fresh seed from the global RNG every epoch


def get_eval_sampler(dataset: Any, *, args: Any, processing_class: Any = None, world_size: int = 1):
    """Sequential for one process, none (sequential, then sharded) for several; the group_by_length quirk."""
    if dataset is None or not has_length(dataset):
        return None
    if args.train_sampling_strategy == "group_by_length":
        seed = args.data_seed if args.data_seed is not None else args.seed
        return LengthGroupedSampler(
            args.eval_batch_size,
            dataset=dataset,
            lengths=_length_column(dataset, args),
            model_input_name=_model_input_name(processing_class),
            generator=torch.Generator().manual_seed(seed),
        )
    return SequentialSampler(dataset) if world_size <= 1 else None
