"""Train / eval / test DataLoaders built exactly as the reference builds and prepares them (spec section 3).

Covers the sampler choice (R3.1), column removal (R3.11), DataLoader arguments and worker seeding (R3.8),
whole-batch sharding across processes (R3.4), epoch forwarding (R3.7), label-name inference (R3.12) and
`num_examples`. transformers, accelerate and datasets are never imported here.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from hf_lightning.collate import RemoveColumnsCollator, ignored_columns_message, pick_default_collator
from hf_lightning.samplers import (
    BatchRebalanceSampler,
    LengthGroupedSampler,
    SeedableRandomSampler,
    lengths_from_items,
    shard_batches,
)
from hf_lightning.seeding import set_seed

logger = logging.getLogger(__name__)

# `AcceleratorConfig()` defaults, which the reference uses when `accelerator_config` is None.
_ACCELERATOR_DEFAULTS = {
    "split_batches": False,
    "dispatch_batches": None,
    "even_batches": True,
    "use_seedable_sampler": True,
}
_DATALOADER_ACCEPTS_IN_ORDER = "in_order" in inspect.signature(DataLoader.__init__).parameters


# ---- model introspection ---------------------------------------------------------------------------------


def _is_peft_model(model: Any) -> bool:
    peft = sys.modules.get("peft")  # a PEFT model can only exist once peft is imported
    wrappers = tuple(getattr(peft, name) for name in ("PeftModel", "PeftMixedModel") if hasattr(peft, name))
    return bool(wrappers) and isinstance(model, wrappers)


def unwrap_peft_model(model: Any) -> Any:
    """The base model of a PEFT wrapper (whose `forward` decides labels and columns); others unchanged."""
    if not _is_peft_model(model):
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


def _apply_column_removal(dataset, data_collator, *, args, model, description):
    if not args.remove_unused_columns:
        return dataset, data_collator
    columns = signature_columns(model, resolve_label_names(args, model))
    model_name = type(model).__name__
    if is_datasets_dataset(dataset):
        return remove_unused_columns(dataset, columns, description, model_name), data_collator
    wrapped = RemoveColumnsCollator(
        data_collator, columns, logger, model_name=model_name, description=description
    )
    return dataset, wrapped


# ---- samplers ---------------------------------------------------------------------------------------------


def has_length(dataset: Any) -> bool:
    """True when `len(dataset)` works (the reference's test for a sized dataset)."""
    try:
        return len(dataset) is not None
    except (TypeError, AttributeError):
        return False


def accelerator_option(args: Any, name: str) -> Any:
    """One `accelerator_config` entry (object or dict), the `AcceleratorConfig()` default when unset."""
    config = getattr(args, "accelerator_config", None)
    if config is None:
        return _ACCELERATOR_DEFAULTS[name]
    if isinstance(config, Mapping):
        return config.get(name, _ACCELERATOR_DEFAULTS[name])
    return getattr(config, name)


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
) -> Sampler | None:
    """The reference's train sampler for `args.train_sampling_strategy` (R3.1); None for unsized data.

    The random order is seeded with `data_seed`, else `seed_for_sampler`, else `torch.initial_seed()`
    read now (the reference reads it when the train loader is built).
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
            args.train_batch_size * args.gradient_accumulation_steps,
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
            effective_batch_size=args.train_batch_size * args.gradient_accumulation_steps * world_size,
            dp_size=world_size,
            grad_accum=args.gradient_accumulation_steps,
            rank=process_index if world_size > 1 else 0,
            drop_last=args.dataloader_drop_last,
        )
    if strategy == "sequential":
        return SequentialSampler(dataset)
    # "random" and any other string, as in the reference.
    if accelerator_option(args, "use_seedable_sampler"):
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


# ---- the DataLoader ---------------------------------------------------------------------------------------


def seed_worker(worker_id: int, num_workers: int, rank: int) -> None:
    """Seed Python, NumPy and torch in a worker from its torch seed, like the reference's `seed_worker`."""
    set_seed(num_workers * rank + torch.initial_seed() % 2**32)


def forward_set_epoch(dataloader: Any, epoch: int) -> None:
    """Forward `epoch` to the batch sampler, the samplers inside it, or the dataset, as accelerate does."""
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    if hasattr(batch_sampler, "set_epoch"):
        batch_sampler.set_epoch(epoch)
    if hasattr(batch_sampler, "sampler") and hasattr(batch_sampler.sampler, "set_epoch"):
        batch_sampler.sampler.set_epoch(epoch)
    inner = getattr(batch_sampler, "batch_sampler", None)
    if hasattr(inner, "sampler") and hasattr(inner.sampler, "set_epoch"):
        inner.sampler.set_epoch(epoch)
    # [quirk] accelerate reaches the dataset only when the sharded inner sampler has no set_epoch.
    elif hasattr(dataloader.dataset, "set_epoch"):
        dataloader.dataset.set_epoch(epoch)


class HFDataLoader(DataLoader):
    """A DataLoader that iterates like accelerate's prepared loader.

    It re-applies its epoch when an iteration starts and counts completed iterations, and it fetches one
    batch ahead, so collation that draws random numbers interleaves with the model's draws exactly as in
    the reference.
    """

    def __init__(self, dataset: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(dataset, *args, **kwargs)
        self.iteration = 0

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch `epoch` (sampler order, dataset `set_epoch`)."""
        self.iteration = epoch
        forward_set_epoch(self, epoch)

    def __iter__(self) -> Iterator[Any]:
        self.set_epoch(self.iteration)
        iterator = super().__iter__()
        try:
            current = next(iterator)
        except StopIteration:
            return
        while True:
            try:
                upcoming = next(iterator)
            except StopIteration:
                yield current
                break
            yield current
            current = upcoming
        self.iteration += 1


def set_train_epoch(dataloader: Any, epoch: int) -> None:
    """What the reference's training loop does at the start of epoch `epoch`, before iterating (R3.7)."""
    if hasattr(dataloader, "set_epoch"):
        dataloader.set_epoch(epoch)
    else:
        forward_set_epoch(dataloader, epoch)
    # A batch sampler inside the shard wrapper (batch_rebalance under W > 1) is reached explicitly.
    inner = getattr(getattr(dataloader, "batch_sampler", None), "batch_sampler", None)
    if hasattr(inner, "set_epoch"):
        inner.set_epoch(epoch)


def _loader_arguments(args: Any, batch_size: int, collate_fn: Callable) -> dict[str, Any]:
    params: dict[str, Any] = {
        "batch_size": batch_size,
        "collate_fn": collate_fn,
        "num_workers": args.dataloader_num_workers,
        "pin_memory": args.dataloader_pin_memory,
        "persistent_workers": args.dataloader_persistent_workers,
        "multiprocessing_context": args.dataloader_multiprocessing_context,
        "prefetch_factor": args.dataloader_prefetch_factor,
    }
    if _DATALOADER_ACCEPTS_IN_ORDER:
        params["in_order"] = args.dataloader_in_order
    elif not args.dataloader_in_order:
        raise ValueError(
            f"dataloader_in_order=False needs a torch whose DataLoader takes `in_order` (torch {torch.__version__} "
            "does not); upgrade torch or keep dataloader_in_order=True."
        )
    return params


def _build_dataloader(
    dataset: Any,
    make_sampler: Callable[[Any], Sampler | None],
    *,
    args: Any,
    data_collator: Callable | None,
    model: Any,
    processing_class: Any,
    batch_size: int,
    description: str,
    world_size: int,
    process_index: int,
    is_training: bool,
) -> HFDataLoader:
    # The reference's `_get_dataloader` followed by accelerate's `prepare_data_loader`.
    collator = data_collator if data_collator is not None else pick_default_collator(processing_class)
    dataset, collator = _apply_column_removal(
        dataset, collator, args=args, model=model, description=description
    )
    params = _loader_arguments(args, batch_size, collator)
    if isinstance(dataset, IterableDataset):
        if world_size > 1:
            raise ValueError(
                "An IterableDataset with world_size > 1 is not supported yet by hf_lightning (the reference "
                "reads it on rank 0 and dispatches slices); use a map-style dataset with a length."
            )
        return HFDataLoader(dataset, **params)

    sampler = make_sampler(dataset)
    if isinstance(sampler, BatchRebalanceSampler):
        # Already rank-aware: used as the batch sampler and never re-sharded.
        params.pop("batch_size")
        params["batch_sampler"] = sampler
    else:
        params["sampler"] = sampler
        params["drop_last"] = args.dataloader_drop_last
    if is_training:
        params["worker_init_fn"] = functools.partial(
            seed_worker, num_workers=args.dataloader_num_workers, rank=process_index
        )
    if world_size <= 1 or isinstance(sampler, BatchRebalanceSampler):
        return HFDataLoader(dataset, **params)

    if accelerator_option(args, "dispatch_batches"):
        raise ValueError(
            "accelerator_config.dispatch_batches=True is not supported by hf_lightning for map-style datasets; "
            "leave it unset (None) or False: each process then loads its own whole batches."
        )
    sampler = params.pop("sampler")
    sampler = sampler if sampler is not None else SequentialSampler(dataset)
    batch_sampler = BatchSampler(sampler, params.pop("batch_size"), params.pop("drop_last"))
    params["batch_sampler"] = shard_batches(
        batch_sampler,
        num_processes=world_size,
        process_index=process_index,
        even_batches=accelerator_option(args, "even_batches"),
        split_batches=accelerator_option(args, "split_batches"),
    )
    return HFDataLoader(dataset, **params)


def build_train_dataloader(
    dataset: Any,
    *,
    args: Any,
    data_collator: Callable | None,
    model: Any,
    processing_class: Any = None,
    world_size: int = 1,
    process_index: int = 0,
    seed_for_sampler: int | None = None,
    batch_size: int | None = None,
) -> HFDataLoader:
    """This process's train DataLoader, as the reference's `get_train_dataloader` + accelerate prepare.

    Run on every rank. `data_collator=None` picks the reference's default for `processing_class`;
    `batch_size` defaults to `args.train_batch_size` (auto_find_batch_size passes the reduced one).
    """
    if dataset is None:
        raise ValueError("Trainer: training requires a train_dataset.")
    make_sampler = functools.partial(
        get_train_sampler,
        args=args,
        processing_class=processing_class,
        world_size=world_size,
        process_index=process_index,
        seed_for_sampler=seed_for_sampler,
    )
    return _build_dataloader(
        dataset,
        make_sampler,
        args=args,
        data_collator=data_collator,
        model=model,
        processing_class=processing_class,
        batch_size=batch_size if batch_size is not None else args.train_batch_size,
        description="Training",
        world_size=world_size,
        process_index=process_index,
        is_training=True,
    )


def build_eval_dataloader(
    dataset: Any,
    *,
    args: Any,
    data_collator: Callable | None,
    model: Any,
    processing_class: Any = None,
    world_size: int = 1,
    process_index: int = 0,
    description: str = "Evaluation",
) -> HFDataLoader:
    """This process's eval (or, with `description="test"`, test) DataLoader, as the reference builds it.

    Sequential single-process; with several processes sequential batches dealt round-robin, padded
    with repeats that the metric gathering drops. Run on every rank.
    """
    if dataset is None:
        raise ValueError("Trainer: evaluation requires an eval_dataset.")
    make_sampler = functools.partial(
        get_eval_sampler, args=args, processing_class=processing_class, world_size=world_size
    )
    return _build_dataloader(
        dataset,
        make_sampler,
        args=args,
        data_collator=data_collator,
        model=model,
        processing_class=processing_class,
        batch_size=args.eval_batch_size,
        description=description,
        world_size=world_size,
        process_index=process_index,
        is_training=False,
    )


def num_examples(dataloader: Any, per_device_train_batch_size: int) -> int:
    """`len(dataloader.dataset)`, else `len(dataloader) * per_device_train_batch_size` (the reference's rule)."""
    try:
        return len(dataloader.dataset)
    except (NameError, AttributeError, TypeError):
        return len(dataloader) * per_device_train_batch_size
