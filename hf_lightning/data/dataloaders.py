"""Train / eval / test DataLoaders built exactly as the reference builds and prepares them (R3.1-R3.12).

DataLoader arguments and worker seeding (R3.8), whole-batch sharding across processes (R3.4), epoch
forwarding and an iterable dataset across processes (R3.7, `data/iterable_sharding.py`) and `num_examples`; the sampler choice and column removal come from `data/model_inputs.py`.
transformers, accelerate and datasets are never imported here.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler, SequentialSampler
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import BatchSampler as StatefulBatchSampler

from hf_lightning.core.seeding import set_seed
from hf_lightning.data.batch_skipping import LazyBatches, SkipFirst, skip_iterable_examples
from hf_lightning.data.collate import pick_default_collator
from hf_lightning.data.context import DataContext
from hf_lightning.data.iterable_sharding import (
    IterableDatasetShard,
    check_split_batch_size,
    dispatched_batches,
    shard_iterable_dataset,
    synchronize_generator,
)
from hf_lightning.data.loader_position import (
    ContinueAt,
    LoaderPosition,
    PositionPlan,
    calling_after_first,
    plan_train_position,
)
from hf_lightning.data.model_inputs import (
    apply_column_removal,
)
from hf_lightning.data.position_files import DataPositionRecord
from hf_lightning.data.samplers import BatchRebalanceSampler, shard_batches

_DATALOADER_ACCEPTS_IN_ORDER = "in_order" in inspect.signature(DataLoader.__init__).parameters


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
    # A user's loader may be any sized iterable, without `dataset` (e.g. a wrapper over several loaders).
    elif hasattr(getattr(dataloader, "dataset", None), "set_epoch"):
        dataloader.dataset.set_epoch(epoch)


class HFDataLoader(DataLoader):
    """A DataLoader that iterates like accelerate's prepared loader.

    It re-applies its epoch when an iteration starts and counts completed iterations, and it fetches one
    batch ahead, so collation that draws random numbers interleaves with the model's draws exactly as in
    the reference. A train loader also knows its position (`positions`, data/loader_position.py), which a checkpoint
    records (`position_record`).
    """

    def __init__(self, dataset: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(dataset, *args, **kwargs)
        self.iteration = 0
        self._skip_next_iteration = 0
        self._skipping_now = 0
        self._continue: ContinueAt | None = None
        self.positions: LoaderPosition | None = None  # train loaders (`_build_dataloader`)
        # A generator set to the first process's state at each iteration (data/iterable_sharding.py).
        self.synchronized_generator: torch.Generator | None = None
        # The batch just yielded is its iteration's last (accelerate's `end_of_dataloader`): read by the evaluation
        # loop, which so draws no batch further ahead than accelerate's prepared loader does.
        self.end_of_dataloader = False

    # accelerate's `remainder`: the samples of the last batch once an iteration has started (-1: unknown, or none to
    # cut because the last batch is dropped); scripts and libraries written against the reference read it.
    remainder = -1

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch `epoch` (sampler order, dataset `set_epoch`)."""
        self.iteration = epoch
        forward_set_epoch(self, epoch)

    @property
    def total_batch_size(self) -> int:
        """Examples per step over all processes (accelerate's `total_batch_size`): the batch sampler's size, times
        the processes it deals to unless it splits each batch across them."""
        batch_sampler = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        if getattr(batch_sampler, "split_batches", False):
            return batch_sampler.batch_size
        return batch_sampler.batch_size * getattr(batch_sampler, "num_processes", 1)

    @property
    def total_dataset_length(self) -> int:
        """accelerate's `total_dataset_length`: the dataset's `total_length` (a shard's whole), else its length."""
        return self.dataset.total_length if hasattr(self.dataset, "total_length") else len(self.dataset)

    def _start_remainder(self) -> None:
        """accelerate's `begin()`: the last batch's samples, known from the lengths where the last batch is kept."""
        self.remainder = -1
        if self.drop_last or getattr(self.batch_sampler, "drop_last", False):
            return
        with contextlib.suppress(Exception):
            self.remainder = getattr(self.dataset, "total_dataset_length", len(self.dataset)) % self.total_batch_size

    def skip_first_batches_once(self, num_batches: int) -> None:
        """Make the next iteration start at batch `num_batches` of its epoch (resume fast-forward).

        A map-style dataset is skipped at the batch-index level: the skipped batches' indices are drawn from the
        (batch) sampler but no item is loaded or collated, so the cost does not grow with the data skipped. An
        IterableDataset has no indices: its first batches' examples are drawn and discarded, collated too (as
        accelerate replays them) unless the collator is known to have no side effects (`skip_iterable_examples`).
        `len()` is unchanged (it stays the epoch's length).
        """
        if num_batches < 0:
            raise ValueError(f"skip_first_batches_once: num_batches must be >= 0, got {num_batches}.")
        self._skip_next_iteration = num_batches

    def position_record(
        self, *, global_step: int, epoch: int, batch: int, always: bool = False
    ) -> DataPositionRecord | None:
        """What a checkpoint at `global_step` keeps of this train loader, `batch` batches into pass `epoch` (None for a
        loader that records nothing). A pass already completed is the next one's start. `always`: also for a
        map-style dataset read by index (a run guard took windows out, so the step is not the position)."""
        positions = self.positions
        if positions is None or (positions.restore == "sampler" and not positions.stateful and not always):
            return None  # a map-style dataset read by index: trainer_state.json's step is its position, as the reference's
        if self.iteration > epoch:  # the pass ended and its end was counted (an epoch-end save)
            return positions.record(global_step=global_step, epoch=self.iteration, batch=0, end_of_epoch=False)
        return positions.record(global_step=global_step, epoch=epoch, batch=batch, end_of_epoch=self.end_of_dataloader)

    @property
    def _index_sampler(self) -> Any:
        # Read by torch's iterator when it is created: the skipping wrapper exists only for that moment, so
        # `len(self)` and later epochs see the plain sampler (a persistent-worker iterator that keeps the wrapper
        # finds its skip count spent).
        sampler = super()._index_sampler
        return SkipFirst(sampler, self._skipping_now) if self._skipping_now else sampler

    def __iter__(self) -> Iterator[Any]:
        # Lazy, as a generator would be: the epoch and a resume skip are read when the first batch is drawn.
        return one_batch_ahead(self._start_iteration, before_last=self._reached_end, after_last=self._count_iteration)

    def _reached_end(self, _last_batch: Any) -> None:
        self.end_of_dataloader = True

    def _start_iteration(self) -> Iterator[Any]:
        self.end_of_dataloader = False
        self._start_remainder()
        if self.synchronized_generator is not None:
            synchronize_generator(self.synchronized_generator)
        self.set_epoch(self.iteration)
        skip, self._skip_next_iteration = self._skip_next_iteration, 0
        resume, self._continue = self._continue, None
        if resume is not None:
            self.load_state_dict(resume.state)  # StatefulDataLoader: the iterator created next starts there
            iterator, first = super().__iter__(), resume.batch
        else:
            iterator, first = self._skipped_iterator(skip), skip
        positions = self.positions
        if positions is not None and positions.stateful:
            iterator = positions.recording(iterator, first)
        if resume is not None and resume.after_first_fetch is not None:
            iterator = calling_after_first(iterator, resume.after_first_fetch)
        return iterator

    def _skipped_iterator(self, skip: int) -> Iterator[Any]:
        replay = skip if isinstance(self.dataset, IterableDataset) else 0
        self._skipping_now = skip - replay
        try:
            if self._skipping_now and self._iterator is not None:
                # A persistent-worker iterator re-reads the index sampler it cached at creation.
                self._iterator._index_sampler = self._index_sampler
            iterator = super().__iter__()
        finally:
            self._skipping_now = 0
        if replay and skip_iterable_examples(iterator, replay):
            return iterator
        for _ in range(replay):
            if next(iterator, _EXHAUSTED) is _EXHAUSTED:
                return iter(())  # the epoch ended inside the replayed batches: not a completed iteration
        return iterator

    def _count_iteration(self) -> None:
        self.iteration += 1


class StatefulHFDataLoader(HFDataLoader, StatefulDataLoader):
    """An HFDataLoader read through torchdata's `StatefulDataLoader`, whose state (the sampler's, each worker's, the
    dataset wrapper's: data/resumable_datasets.py) is captured while training reads it and restored by a resume."""

    def continue_from(self, batch: int, state: dict[str, Any], after_first_fetch: Callable[[], None] | None) -> bool:
        """Make the next iteration continue at batch `batch` from the loader `state` recorded there (nothing skipped
        is fetched). With no workers and a collator drawing random numbers, the main process's random state is put
        back for the first fetch: then `after_first_fetch` runs right after it (the checkpoint's own random state
        follows from there) and True is returned; otherwise it is not called."""
        calls_back = self.num_workers == 0 and self.positions is not None and self.positions.keeps_random_state
        self._continue = ContinueAt(batch, state, after_first_fetch if calls_back else None)
        return calls_back

    @property
    def _index_sampler(self) -> Any:
        # torchdata's batch sampler starts the sampler eagerly; torch's DataLoader, whose random draws we keep, lazily.
        sampler = super()._index_sampler
        return LazyBatches(sampler) if isinstance(sampler, StatefulBatchSampler) else sampler


_EXHAUSTED = object()


def one_batch_ahead(
    start: Callable[[], Iterator[Any]],
    before_last: Callable[[Any], None] | None = None,
    after_last: Callable[[], None] | None = None,
) -> Iterator[Any]:
    """Yield the items of `start()` (called when the first item is drawn), drawing each one ahead of time so the
    last is known before it is yielded, as accelerate's prepared loaders do: `before_last(item)` runs just before
    the last item is yielded, `after_last()` once the iteration is resumed after it (not for an empty one)."""
    iterator = start()
    try:
        current = next(iterator)
    except StopIteration:
        return
    while True:
        try:
            upcoming = next(iterator)
        except StopIteration:
            if before_last is not None:
                before_last(current)
            yield current
            break
        yield current
        current = upcoming
    if after_last is not None:
        after_last()


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
    context: DataContext,
    *,
    batch_size: int,
    description: str,
    is_training: bool,
) -> HFDataLoader:
    # The reference's `_get_dataloader` followed by accelerate's `prepare_data_loader`.
    args, world_size, process_index = context.args, context.world_size, context.process_index
    collator = context.data_collator
    if collator is None:
        collator = pick_default_collator(context.processing_class)
    dataset, collator = apply_column_removal(
        dataset, collator, args=args, model=context.model, description=description, columns=context.columns
    )
    params = _loader_arguments(args, batch_size, collator)
    if isinstance(dataset, IterableDataset):
        if world_size > 1:
            return _iterable_loader_across_processes(dataset, params, context)
        if not is_training:  # an eval loop never resumes into its dataset: nothing to record
            return HFDataLoader(dataset, **params)
        return _train_loader(dataset, params, args=args, num_processes=1)

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
        if is_training:
            return _train_loader(dataset, params, args=args, num_processes=world_size)
        return HFDataLoader(dataset, **params)

    settings = context.settings
    if settings.dispatch_batches:
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
        even_batches=settings.even_batches,
        split_batches=settings.split_batches,
    )
    if is_training:
        return _train_loader(dataset, params, args=args, num_processes=world_size)
    return HFDataLoader(dataset, **params)


def _train_loader(dataset: Any, params: dict[str, Any], *, args: Any, num_processes: int) -> HFDataLoader:
    """This process's train loader, read so that a resume can put it back (data/loader_position.py): a plain
    HFDataLoader whose sampler skips indices, or a StatefulHFDataLoader over the dataset's wrapper."""
    plan: PositionPlan = plan_train_position(
        dataset, params["collate_fn"], num_workers=params["num_workers"], in_order=args.dataloader_in_order
    )
    if plan.stateful:
        with warnings.catch_warnings():
            # torchdata 0.11 calls torch.set_vital, which torch 2.13 deprecates: a warning per loader, none of ours.
            warnings.filterwarnings("ignore", message=".*set_vital.*is deprecated")
            # Workers report their state with every batch, so the state after any batch is known.
            loader: HFDataLoader = StatefulHFDataLoader(plan.dataset, snapshot_every_n_steps=1, **params)
    else:
        loader = HFDataLoader(plan.dataset, **params)
    batch_size = loader.batch_size if loader.batch_size is not None else getattr(loader.batch_sampler, "batch_size", None)
    loader.positions = LoaderPosition(
        plan,
        dataset_name=type(dataset).__name__,
        kind="iterable" if isinstance(dataset, IterableDataset) else "map",
        batch_size=batch_size if isinstance(batch_size, int) else None,
        num_processes=num_processes,
        num_workers=params["num_workers"],
    )
    return loader


def _iterable_loader_across_processes(
    dataset: IterableDataset, params: dict[str, Any], context: DataContext
) -> HFDataLoader:
    """A loader over an IterableDataset on `world_size` processes, as accelerate prepares it (R3.7): dealt from the
    first process (`dispatch_batches` None or True) or read by each (`dispatch_batches=False`); the same for the
    train, eval and test loaders (the evaluation loop's gather drops the completed tail, `last_batch_remainder`)."""
    args, world_size, process_index = context.args, context.world_size, context.process_index
    settings = context.settings
    if settings.dispatch_batches is False:
        generator = getattr(dataset, "generator", None)
        dataset, params["batch_size"] = shard_iterable_dataset(
            dataset,
            batch_size=params["batch_size"],
            num_processes=world_size,
            process_index=process_index,
            split_batches=settings.split_batches,
        )
        loader = HFDataLoader(dataset, **params)
        if isinstance(generator, torch.Generator) and isinstance(dataset, IterableDatasetShard):
            # accelerate's DataLoaderShard(synchronized_generator=...): rank 0's state on every rank at each iteration.
            loader.synchronized_generator = generator
    else:
        if args.world_size > world_size:  # fewer replicas than processes: tensor-parallel groups
            raise ValueError(
                f"An IterableDataset dealt from the first process (accelerator_config.dispatch_batches, the default "
                f"for an iterable dataset) with tensor parallelism over {world_size} data-parallel replicas is not "
                "supported (accelerate refuses TP with data parallelism in dispatch mode); set "
                "accelerator_config={'dispatch_batches': False} so each process reads the dataset."
            )
        if settings.split_batches:
            check_split_batch_size(params["batch_size"], world_size)
        loader = DispatchingDataLoader(
            dataset, num_processes=world_size, process_index=process_index, split_batches=settings.split_batches,
            **params,
        )  # fmt: skip
    # No position is recorded: a resume replays the batches already trained on, as the reference does.
    return loader


class DispatchingDataLoader(HFDataLoader):
    """An HFDataLoader over an IterableDataset whose batches the first process draws and deals to every process
    (`data/iterable_sharding.py` `dispatched_batches`), as accelerate's `DataLoaderDispatcher`.

    Every process creates the torch iterator (as the reference does, so worker processes start everywhere); only the
    first one reads it. It draws the next step's batches ahead itself, so no `one_batch_ahead` is added on top.
    A resume skip replays the skipped batches, dealt and discarded, as the reference's does.
    """

    def __init__(
        self, dataset: Any, *args: Any, num_processes: int, process_index: int, split_batches: bool, **kwargs: Any
    ) -> None:
        super().__init__(dataset, *args, **kwargs)
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        # accelerate's `remainder`: real samples of the last joined batch, once the iteration reached it (-1: unknown).
        self.remainder = -1

    @property
    def total_batch_size(self) -> int:
        """Examples per step over all processes (accelerate's `total_batch_size`)."""
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

    def __len__(self) -> int:
        # accelerate's DataLoaderDispatcher: the base loader's length, per process unless split (TypeError unsized).
        whole = DataLoader.__len__(self)
        return whole if self.split_batches else -(-whole // self.num_processes)

    def __iter__(self) -> Iterator[Any]:
        return self._dealt_batches()

    def _reached_last(self, size: int) -> None:
        self.remainder = size
        self.end_of_dataloader = True

    def _dealt_batches(self) -> Iterator[Any]:
        self.set_epoch(self.iteration)
        skip, self._skip_next_iteration = self._skip_next_iteration, 0
        # Unknown until the last batch, sized dataset or not: accelerate's `begin()` fails to compute it for a
        # dispatcher (its `total_batch_size` reads the dataset's `batch_size`) and leaves -1.
        self.remainder = -1
        self.end_of_dataloader = False
        iterator = DataLoader.__iter__(self)
        batches = dispatched_batches(
            iterator if self.process_index == 0 else None,
            num_processes=self.num_processes,
            process_index=self.process_index,
            split_batches=self.split_batches,
            on_last=self._reached_last,
        )
        yield from itertools.islice(batches, skip, None)
        self.iteration += 1


def build_dataloader(
    dataset: Any,
    make_sampler: Callable[[Any], Sampler | None],
    context: DataContext,
    *,
    batch_size: int,
    description: str,
    is_training: bool = False,
) -> HFDataLoader:
    """A DataLoader from a sampler factory (the facade's `_get_dataloader`): column removal, collation,
    `make_sampler(dataset)` as the sampler, this process's share of the batches."""
    return _build_dataloader(
        dataset, make_sampler, context, batch_size=batch_size, description=description, is_training=is_training
    )


def num_examples(dataloader: Any, per_device_train_batch_size: int) -> int:
    """`len(dataloader.dataset)`, else `len(dataloader) * per_device_train_batch_size` (the reference's rule)."""
    try:
        return len(dataloader.dataset)
    except (NameError, AttributeError, TypeError):
        return len(dataloader) * per_device_train_batch_size
