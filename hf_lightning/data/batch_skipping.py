"""Skipping a resumed epoch's first batches: by index (`SkipFirst`), or an iterable dataset's examples drawn without
collating them (`skip_iterable_examples`); and `LazyBatches`, which keeps torchdata's batch sampler from starting
its sampler before torch's DataLoader would."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torchdata.stateful_dataloader.stateful_dataloader import _StatefulSingleProcessDataLoaderIter

from hf_lightning.data.collate import collates_without_side_effects

# The main-process iterators (torch's, torchdata's) whose examples `skip_iterable_examples` can skip uncollated.
SINGLE_PROCESS_ITERATORS = (
    torch.utils.data.dataloader._SingleProcessDataLoaderIter,
    _StatefulSingleProcessDataLoaderIter,
)

def skip_iterable_examples(iterator: Any, batches: int) -> bool:
    """Skip an IterableDataset's first `batches` batches without collating them, when that is the same as loading
    and discarding them: one process reading the dataset (no workers), a collator known to draw no random numbers.
    Then only the examples are drawn (what a batch's fetch draws: `batch_size` of them, fewer at the end), so the
    resume cost is the dataset's own iteration. Returns False (nothing skipped) where that cannot be told; a
    dataset that ends inside the skipped batches leaves the iterator exhausted, as the replay would."""
    fetcher = getattr(iterator, "_dataset_fetcher", None)
    examples = getattr(fetcher, "dataset_iter", None)
    if not isinstance(iterator, SINGLE_PROCESS_ITERATORS) or examples is None:
        return False
    if not collates_without_side_effects(getattr(fetcher, "collate_fn", None)):
        return False
    per_batch = iterator._index_sampler.batch_size if fetcher.auto_collation else 1
    wanted = batches * per_batch
    drawn = sum(1 for _ in itertools.islice(examples, wanted))
    for _ in itertools.islice(iterator._sampler_iter, batches):  # the batches' (empty) indices, as fetches take
        pass
    iterator._num_yielded += batches
    if drawn < wanted:
        fetcher.ended = True  # the dataset ended inside the skipped batches: no batch is left in this epoch
    return True


class SkipFirst:
    """Iterate `sampler` without its first `skip` elements (indices or index lists), once: the skip is spent
    when the first element is drawn, not by `iter()`. torch's multi-worker iterator calls `iter()` twice while it
    is created (its base `__init__`, then `_reset`) and draws only from the second."""

    def __init__(self, sampler: Any, skip: int) -> None:
        self.sampler = sampler
        self.skip = skip

    def __iter__(self) -> Iterator[Any]:
        skip, self.skip = self.skip, 0
        yield from itertools.islice(iter(self.sampler), skip, None)

    def __len__(self) -> int:
        return max(len(self.sampler) - self.skip, 0)


class LazyBatches:
    """A batch sampler whose iterator starts its sampler when the first batch is drawn, as torch's generator-based
    `BatchSampler` does. torchdata's batch sampler starts it when its iterator is created, before the DataLoader
    iterator draws its base seed, so a sampler that draws random numbers in `iter()` (a length-grouped one) would
    see other numbers than under torch's DataLoader. Its iterator keeps torchdata's state protocol."""

    def __init__(self, batch_sampler: Any) -> None:
        self.batch_sampler = batch_sampler

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __getattr__(self, name: str) -> Any:  # batch_size, drop_last, sampler: the batch sampler's
        if name == "batch_sampler":
            raise AttributeError(name)
        return getattr(self.batch_sampler, name)

    def __iter__(self) -> _LazyBatchIterator:
        return _LazyBatchIterator(self.batch_sampler)


class _LazyBatchIterator(Iterator[Any]):
    def __init__(self, batch_sampler: Any) -> None:
        self._batch_sampler = batch_sampler
        self._iterator: Any = None

    def _started(self) -> Any:
        if self._iterator is None:
            self._iterator = iter(self._batch_sampler)
        return self._iterator

    def __next__(self) -> Any:
        return next(self._started())

    def state_dict(self) -> dict[str, Any]:
        if self._iterator is None:  # nothing drawn yet: the state of a fresh iterator, without starting it
            return {"samples_yielded": 0}
        return self._iterator.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._started().load_state_dict(state)
