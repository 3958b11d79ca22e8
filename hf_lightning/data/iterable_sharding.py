"""An IterableDataset's batches (train, eval or test) across several processes, dealt as accelerate's prepared loaders
deal them (R3.7).

With dispatch (`accelerator_config.dispatch_batches` None or True: the reference's default for an iterable dataset)
only the first process draws batches: it joins `W` of them (takes one with `split_batches`), sends the result to
every process, and each keeps its slice (`dispatched_batches`). Without it (`dispatch_batches=False`) every process
reads the dataset: an HF datasets stream with at least `W` shards is split by shard, any other iterable goes through
`IterableDatasetShard`, which keeps this process's `batch_size` examples of every `W * batch_size`
(`shard_iterable_dataset`). The last, short global batch is completed with the epoch's first examples in both, so
every process trains on a batch of the same size. transformers, accelerate and datasets are never imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset

__all__ = [
    "IterableDatasetShard",
    "check_split_batch_size",
    "dispatched_batches",
    "shard_iterable_dataset",
    "synchronize_generator",
]

_DIFFERENT_SIZES = (
    "The batches of an IterableDataset read on several processes must all have the same size to be joined and "
    "dealt (accelerator_config.dispatch_batches, the default for an iterable dataset): set "
    "accelerator_config={'dispatch_batches': False} so that each process reads its own batches, or "
    "{'split_batches': True} so that the first process reads one whole batch and splits it."
)


def _field_error(path: str, value: Any) -> TypeError:
    return TypeError(
        f"An IterableDataset's batch read on several processes holds a {type(value).__name__} at {path or 'the top'}: "
        "only nested lists, tuples and dicts of tensors can be dealt to the processes (as the reference requires); "
        "make the collator return tensors there, or drop that field."
    )


def concatenate(batches: list[Any], path: str = "") -> Any:
    """The batches joined on dim 0, field by field (accelerate's `concatenate`)."""
    first = batches[0]
    if isinstance(first, (list, tuple)):
        items = [concatenate([batch[i] for batch in batches], f"{path}[{i}]") for i in range(len(first))]
        return type(first)(*items) if hasattr(first, "_fields") else type(first)(items)
    if isinstance(first, Mapping):
        return type(first)({key: concatenate([batch[key] for batch in batches], f"{path}[{key!r}]") for key in first})
    if not isinstance(first, torch.Tensor):
        raise _field_error(path, first)
    try:
        return torch.cat(batches, dim=0)
    except RuntimeError as error:
        raise RuntimeError(_DIFFERENT_SIZES) from error


def slice_batch(batch: Any, part: slice) -> Any:
    """Every tensor of `batch` sliced on dim 0; other leaves unchanged (accelerate's `slice_tensors`)."""
    if isinstance(batch, (list, tuple)):
        items = [slice_batch(item, part) for item in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    if isinstance(batch, Mapping):
        return type(batch)({key: slice_batch(value, part) for key, value in batch.items()})
    return batch[part] if isinstance(batch, torch.Tensor) else batch


def batch_size_of(batch: Any, path: str = "") -> int:
    """The dim-0 size of the first tensor found depth first (accelerate's `find_batch_size`)."""
    if isinstance(batch, (list, tuple, Mapping)):
        if len(batch) == 0:
            raise ValueError(f"Cannot find the batch size of an empty {type(batch).__name__} at {path or 'the top'}.")
        key = 0 if isinstance(batch, (list, tuple)) else next(iter(batch))
        return batch_size_of(batch[key], f"{path}[{key!r}]")
    if not isinstance(batch, torch.Tensor):
        raise _field_error(path, batch)
    return batch.shape[0]


class _Failure(str):
    """The first process's error while reading a batch, told to the other processes."""


def _checked(batch: Any) -> Any:
    _check_tensors(batch)
    return batch


def _check_tensors(batch: Any, path: str = "") -> None:
    if isinstance(batch, (list, tuple)):
        for i, item in enumerate(batch):
            _check_tensors(item, f"{path}[{i}]")
    elif isinstance(batch, Mapping):
        for key, value in batch.items():
            _check_tensors(value, f"{path}[{key!r}]")
    elif not isinstance(batch, torch.Tensor):
        raise _field_error(path, batch)


def _collective_device() -> torch.device | None:
    """Where a broadcast's tensors must be: this process's GPU under NCCL, anywhere (None) under gloo."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None


def _from_first_process(message: Any) -> Any:
    """`message` as the first process has it, on every process (the first process's own value is returned)."""
    holder = [message]
    dist.broadcast_object_list(holder, src=0, device=_collective_device())
    return holder[0]


def synchronize_generator(generator: torch.Generator) -> None:
    """Set `generator` to the first process's state on every process (accelerate's `synchronize_rng_states`
    for a loader's `synchronized_generator`): a dataset shuffling with it then draws the same order everywhere."""
    state = generator.get_state()
    device = _collective_device()
    if device is not None:
        state = state.to(device)
    dist.broadcast(state, src=0)
    generator.set_state(state.cpu())


def check_split_batch_size(batch_size: int, num_processes: int) -> None:
    """`split_batches` cuts each batch into `num_processes` equal parts: the batch size must allow it."""
    if batch_size > 1 and batch_size % num_processes != 0:
        raise ValueError(
            f"accelerator_config.split_batches=True with a batch size of {batch_size}, which is not a multiple of the "
            f"{num_processes} processes: set per_device_train_batch_size to a multiple of {num_processes}, or leave "
            "split_batches=False."
        )


def dispatched_batches(
    iterator: Iterator[Any] | None,
    *,
    num_processes: int,
    process_index: int,
    split_batches: bool,
    on_last: Callable[[int], None] | None = None,
) -> Iterator[Any]:
    """This process's slices of the batches the first process draws from `iterator` (only its iterator is read).

    Per step the first process draws `num_processes` batches and joins them (one batch with `split_batches`), and
    draws the next step's ahead of time, as accelerate's `DataLoaderDispatcher` does (so a collator that draws
    random numbers draws them at the same moments). A last, short joined batch whose size does not divide by
    `num_processes` is completed with the epoch's first examples. `on_last(size)` is told the last joined batch's
    size, before completion, just before its slice is yielded (accelerate's `remainder`: the real samples of it).
    """
    is_first = process_index == 0
    stopped = False  # the first process's iterator is exhausted (told to every process)

    def told(value: Any) -> Any:
        # What the first process tells: its own failure is re-raised on the others, which would otherwise wait.
        value = _from_first_process(value)
        if isinstance(value, _Failure):
            raise RuntimeError(f"The first process failed to read the next batch of the IterableDataset: {value}")
        return value

    def first_process_reads(read: Any) -> Any:
        try:
            return read()
        except StopIteration:
            raise
        except Exception as error:
            _from_first_process(_Failure(f"{type(error).__name__}: {error}"))
            raise

    def fetch() -> tuple[Any, bool]:
        # (the joined batch on the first process, None elsewhere; whether there is one)
        nonlocal stopped
        batch, parts = None, []
        if is_first:
            try:
                if split_batches:
                    batch = first_process_reads(lambda: _checked(next(iterator)))
                else:
                    for _ in range(num_processes):  # one by one: a short tail is kept
                        parts.append(first_process_reads(lambda: next(iterator)))
                    batch = first_process_reads(lambda: _checked(concatenate(parts)))
                stop = False
            except StopIteration:
                stop = True
        else:
            stop = stopped
        stopped = told(stop)
        if not stopped:
            return batch, True
        if split_batches:
            return None, False
        tail = is_first and len(parts) > 0
        if tail:
            batch = first_process_reads(lambda: _checked(concatenate(parts)))
        return batch, told(tail)

    first_examples = None
    upcoming, has_upcoming = fetch()
    if not has_upcoming:
        return
    finished = False
    while not finished:
        batch = told(upcoming)  # the whole joined batch reaches every process, then it is sliced
        if first_examples is None:
            first_examples = slice_batch(batch, slice(0, num_processes))
        observed = batch_size_of(batch)
        per_process = observed // num_processes
        finished = stopped
        if not finished:
            upcoming, has_upcoming = fetch()
            finished = stopped and not has_upcoming
        if finished and on_last is not None:
            on_last(observed)
        if finished and observed % num_processes != 0:
            batch = concatenate([batch, first_examples])
            per_process += 1
        yield slice_batch(batch, slice(process_index * per_process, (process_index + 1) * per_process))


class IterableDatasetShard(IterableDataset):
    """This process's part of an iterable dataset read by every process: of each `batch_size * num_processes`
    examples (`batch_size` with `split_batches`), the slice at `process_index` (accelerate's `IterableDatasetShard`).

    A short last global batch is completed by repeating the epoch's first examples unless `drop_last`.
    `set_epoch` reaches the dataset; a dataset without `set_epoch` but with a torch `generator` has it seeded with
    the epoch at each iteration.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        drop_last: bool = False,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
    ) -> None:
        if split_batches:
            check_split_batch_size(batch_size, num_processes)
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        # Only a sized dataset has a length (TypeError otherwise, as for any iterable). As accelerate counts it,
        # split_batches or not.
        whole = self.batch_size * self.num_processes
        if self.drop_last:
            return (len(self.dataset) // whole) * self.batch_size
        return -(-len(self.dataset) // whole) * self.batch_size

    def __iter__(self) -> Iterator[Any]:
        if not hasattr(self.dataset, "set_epoch") and hasattr(self.dataset, "generator"):
            if isinstance(self.dataset.generator, torch.Generator):
                self.dataset.generator.manual_seed(self.epoch)
        whole = self.batch_size if self.split_batches else self.batch_size * self.num_processes
        own = self.batch_size // self.num_processes if self.split_batches else self.batch_size
        mine = range(self.process_index * own, (self.process_index + 1) * own)
        first, current = None, []
        for example in self.dataset:
            current.append(example)
            if len(current) == whole:
                for i in mine:
                    yield current[i]
                if first is None:
                    first = current.copy()
                current = []
        if not self.drop_last and current:
            if first is None:
                first = current.copy()
            while len(current) < whole:
                current += first
            for i in mine:
                yield current[i]


def _is_hf_datasets_stream(dataset: Any) -> bool:
    """An HF datasets `IterableDataset` (recognised by its class, without importing datasets)."""
    return any(cls.__module__.startswith("datasets.") and cls.__name__ == "IterableDataset" for cls in type(dataset).__mro__)


def shard_iterable_dataset(
    dataset: Any, *, batch_size: int, num_processes: int, process_index: int, split_batches: bool
) -> tuple[Any, int]:
    """This process's dataset and loader batch size when every process reads the iterable dataset
    (`dispatch_batches=False`): an HF datasets stream with at least `num_processes` shards keeps its own shards
    (not with `split_batches`), any other dataset is wrapped in `IterableDatasetShard` (which checks a split batch
    size)."""
    if _is_hf_datasets_stream(dataset) and not split_batches and dataset.n_shards >= num_processes:
        return dataset.shard(num_shards=num_processes, index=process_index), batch_size
    shard = IterableDatasetShard(
        dataset,
        batch_size=batch_size,
        drop_last=False,  # the reference's train loader over an iterable dataset never drops its last batch
        num_processes=num_processes,
        process_index=process_index,
        split_batches=split_batches,
    )
    return shard, batch_size // num_processes if split_batches else batch_size
