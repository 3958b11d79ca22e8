"""The train dataset as a stateful loader reads it: a wrapper that says where its reader stands and goes back there.

torchdata's `StatefulDataLoader` records, in the main process and after every batch in each worker, the
`state_dict()` of the dataset it reads (torch's Stateful protocol) and gives it back with `load_state_dict()` before
the next iteration. The wrappers here give every train dataset that protocol, whatever the user's dataset has:

- `PositionedIterable` (an IterableDataset): the dataset's own `state_dict()` where it restores exactly
  (`dataset_state`), otherwise the number of examples this reader drew in the pass (`examples_drawn`), which a
  resume draws again from the pass's start without collating them (a plain iterable, or an HF datasets stream
  whose state its documentation says is inexact: a shuffle buffer, the arrow format over a batched `map`).
- `RandomStateDataset` (a map-style dataset): nothing of the dataset (the sampler holds the position) but the
  random states, for a collator that draws random numbers.

Either keeps the reader's Python, NumPy and torch random states when the collator may draw random numbers
(`keep_random_state`): in a worker they are the worker's after its last batch, in the main process (no workers) the
loader asks just before it fetches a batch, so they are the state that batch's collation starts from.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from typing import Any

from torch.utils.data import Dataset, IterableDataset

from hf_lightning.data.random_state import process_random_state, set_process_random_state


def own_state_is_exact(dataset: Any) -> tuple[bool, str]:
    """Whether `dataset`'s own `state_dict()` / `load_state_dict()` put it back exactly, with the reason when not."""
    if not (callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None))):
        return False, "it has no state_dict() / load_state_dict()"
    inexact = _hf_datasets_inexact_state(dataset)
    if inexact is not None:
        return False, f"HF datasets documents its state as inexact with {inexact}"
    return True, ""


def _hf_datasets_inexact_state(dataset: Any) -> str | None:
    """The two cases HF datasets' `IterableDataset.state_dict` documents as not resuming exactly: a shuffle buffer
    (its examples are lost) and the arrow format over a batched `map` (a batch may be skipped)."""
    stages = _example_iterables(getattr(dataset, "_ex_iterable", None))
    if any(type(stage).__name__ == "BufferShuffledExamplesIterable" for stage in stages):
        return "a shuffle buffer (its examples are not saved)"
    formatting = getattr(dataset, "_formatting", None)
    if getattr(formatting, "format_type", None) == "arrow" and any(getattr(stage, "batched", False) for stage in stages):
        return "the arrow format over a batched map() (a batch may be skipped)"
    return None


def _example_iterables(stage: Any, depth: int = 0) -> list[Any]:
    """An HF datasets IterableDataset's chain of example iterables (each wraps `ex_iterable` or `ex_iterables`)."""
    if stage is None or depth > 64:
        return []
    inner = [getattr(stage, "ex_iterable", None), *(getattr(stage, "ex_iterables", None) or [])]
    return [stage, *(found for child in inner for found in _example_iterables(child, depth + 1))]


def forget_loaded_position(dataset: Any) -> None:
    """Once the resumed iteration has started: HF datasets' IterableDataset keeps a loaded state and starts every
    later iteration of the same epoch there (its `__iter__` applies `_starting_state_dict` while the epoch matches),
    so an evaluation on the same object, a restarted `train()` or the user's own loop would start mid-stream. Our
    contract, torch's Stateful one, is that a loaded position applies to the next iteration only."""
    if getattr(dataset, "_starting_state_dict", None) is not None:
        dataset._starting_state_dict = None


class _Forwarding:
    """Attributes the wrapper does not have are the wrapped dataset's (`set_epoch`, `column_names`, ...)."""

    dataset: Any

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # not yet set (while unpickling in a worker): no recursion
            raise AttributeError(name)
        return getattr(self.dataset, name)


class PositionedIterable(_Forwarding, IterableDataset):
    """An IterableDataset whose reader's position is its state: the dataset's own, or the examples drawn so far.

    `load_state_dict` applies to the next `iter()` only, which puts the reader back at once (loads the dataset's
    state, or draws the recorded number of examples without collating them, then restores the random states), so a
    worker's first state after a resume is already the resumed one.
    """

    def __init__(self, dataset: Any, *, use_dataset_state: bool, keep_random_state: bool):
        self.dataset = dataset
        self.use_dataset_state = use_dataset_state
        self.keep_random_state = keep_random_state
        self._drawn = 0
        self._pending: dict[str, Any] | None = None

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = (
            {"dataset": copy.deepcopy(self.dataset.state_dict())} if self.use_dataset_state else {"examples": self._drawn}
        )
        if self.keep_random_state:
            state["random"] = process_random_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._pending = state

    def __iter__(self) -> Iterator[Any]:
        pending, self._pending = self._pending, None
        loaded = pending is not None and pending.get("dataset") is not None
        if loaded:
            self.dataset.load_state_dict(pending["dataset"])
        iterator = iter(self.dataset)
        skip = pending.get("examples", 0) if pending is not None and not loaded else 0
        self._drawn = sum(1 for _ in itertools.islice(iterator, skip))
        if pending is not None and pending.get("random") is not None:
            set_process_random_state(pending["random"])
        if self.use_dataset_state and not loaded:
            return iterator  # nothing to count or forget: the dataset's own state says where it stands
        return self._counted(iterator, loaded)

    def _counted(self, iterator: Iterator[Any], loaded: bool) -> Iterator[Any]:
        for example in iterator:
            if loaded:
                forget_loaded_position(self.dataset)
                loaded = False
            self._drawn += 1
            yield example


class SizedPositionedIterable(PositionedIterable):
    """A `PositionedIterable` over a dataset with a length (torch asks `len()` of an iterable dataset's loader)."""

    def __len__(self) -> int:
        return len(self.dataset)


class RandomStateDataset(_Forwarding, Dataset):
    """A map-style dataset whose state is its reader's random states (the sampler holds the position)."""

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __getitem__(self, index: Any) -> Any:
        return self.dataset[index]

    def __len__(self) -> int:
        return len(self.dataset)

    def state_dict(self) -> dict[str, Any]:
        return {"random": process_random_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_process_random_state(state["random"])


def positioned_iterable(dataset: Any, *, use_dataset_state: bool, keep_random_state: bool) -> PositionedIterable:
    """The wrapper for `dataset`, sized when it is."""
    try:
        len(dataset)
        cls = SizedPositionedIterable
    except (TypeError, NotImplementedError, AttributeError):
        cls = PositionedIterable
    return cls(dataset, use_dataset_state=use_dataset_state, keep_random_state=keep_random_state)
