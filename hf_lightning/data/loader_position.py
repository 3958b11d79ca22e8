"""Where a train loader stands: how it can be put back (decided when it is built), the states it captures while it is
read, and the record a checkpoint keeps (`data/position_files.py`).

The reference fast-forwards a resumed epoch by drawing the batches already trained on again (accelerate's
`skip_first_batches`): a map-style dataset by index (cheap), an IterableDataset batch by batch, collated (hours on a
large stream: transformers #11284), and after the first pass of an iterable dataset it starts the pass over
(transformers #26413); a collator that draws random numbers masks the first batches after the resume with numbers
drawn before the checkpoint's random state is restored. Here each train loader is read so that it can be put back:

- a map-style dataset whose collator draws no random numbers: the sampler skips the indices (`sampler`);
- any other train dataset is read by torchdata's `StatefulDataLoader` through a wrapper
  (`data/resumable_datasets.py`) and its state is captured before the first batch of each accumulation window (the
  only places a checkpoint can stand): the dataset's own state where it restores exactly (`dataset_state`), else the
  examples each reader drew, drawn again without collation (`examples_drawn`), and, with a collator that may draw
  random numbers, the random states its batches are collated from (the main process's just before the fetch, each
  worker's after its last batch).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils.data import IterableDataset

from hf_lightning.data.collate import collates_without_side_effects
from hf_lightning.data.position_files import POSITION_FORMAT, DataPositionRecord, encode_state
from hf_lightning.data.resumable_datasets import RandomStateDataset, own_state_is_exact, positioned_iterable

logger = logging.getLogger(__name__)

# States kept: a checkpoint is written at a window boundary, the window just started is one more.
_KEPT_CAPTURES = 3


@dataclass(frozen=True)
class PositionPlan:
    """How a train loader over `dataset` is read and put back (`restore`: position_files.RESTORE_MODES)."""

    dataset: Any  # what the loader reads: the user's dataset, or its wrapper
    restore: str
    stateful: bool  # read by torchdata's StatefulDataLoader, its state captured
    keep_random_state: bool
    reason: str = ""  # why an iterable's own state is not used (said once at a resume)


def plan_train_position(dataset: Any, collate_fn: Any, *, num_workers: int, in_order: bool) -> PositionPlan:
    """How this process's train loader over `dataset` keeps its position (one process reading the data, or a map-style
    dataset's share under several processes)."""
    random_collator = not collates_without_side_effects(collate_fn)
    if num_workers > 0 and not in_order:
        # Workers return batches as they finish: no position can name what was trained (torchdata says the same).
        return PositionPlan(dataset, "sampler" if not isinstance(dataset, IterableDataset) else "replay", False, False,
                            "dataloader_in_order=False with workers delivers batches out of order")
    if not isinstance(dataset, IterableDataset):
        if not random_collator:
            return PositionPlan(dataset, "sampler", False, False)
        return PositionPlan(RandomStateDataset(dataset), "sampler", True, True)
    exact, reason = own_state_is_exact(dataset)
    wrapped = positioned_iterable(dataset, use_dataset_state=exact, keep_random_state=random_collator)
    return PositionPlan(wrapped, "dataset_state" if exact else "examples_drawn", True, random_collator, reason)


class LoaderPosition:
    """One train loader's position: what it is (for the record), the window its captures follow, the states
    captured before the window starts of the current pass."""

    def __init__(self, plan: PositionPlan, *, dataset_name: str, kind: str, batch_size: int | None,
                 num_processes: int, num_workers: int):  # fmt: skip
        self.restore = plan.restore
        self.stateful = plan.stateful
        self.keeps_random_state = plan.keep_random_state
        self.reason = plan.reason
        self.dataset_name = dataset_name
        self.kind = kind
        self.batch_size = batch_size
        self.num_processes = num_processes
        self.num_workers = num_workers
        # Micro-batches per accumulation window, set by the run before each epoch: a checkpoint stands at a window
        # boundary, so only those positions are captured.
        self.window = 1
        self.captures: dict[int, Any] = {}
        self._unrecordable_said = False

    def recording(self, iterator: Iterator[Any], first_index: int) -> Iterator[Any]:
        """Yield `iterator`'s batches (the pass's batch `first_index` on), capturing the loader's state before each
        window-start batch is fetched."""
        self.captures.clear()
        return self._recorded(iterator, first_index, getattr(iterator, "state_dict", None), self.window)

    def _recorded(self, iterator: Iterator[Any], index: int, state_dict: Any, window: int) -> Iterator[Any]:
        captures = self.captures
        while True:
            if index and state_dict is not None and index % window == 0:
                captures[index] = state_dict()
                if len(captures) > _KEPT_CAPTURES:
                    del captures[min(captures)]
            try:
                batch = next(iterator)
            except StopIteration:
                return
            index += 1
            yield batch

    def record(self, *, global_step: int, epoch: int, batch: int, end_of_epoch: bool) -> DataPositionRecord:
        """What a checkpoint at `global_step` keeps: this loader at batch `batch` of pass `epoch` (a completed pass is
        the next one's batch 0)."""
        state = self.captures.get(batch) if self.stateful and batch else None
        state_json, tensors = None, {}
        if state is not None:
            try:
                state_json, tensors = encode_state(state)
            except TypeError as error:
                if not self._unrecordable_said:
                    self._unrecordable_said = True
                    logger.warning(f"The train loader's state cannot be saved as JSON ({error}); a resume replays "
                                   "the batches already trained on instead.")  # fmt: skip
        restore = self.restore
        if self.stateful and batch and state_json is None:
            restore = "replay"
        samples = batch * self.batch_size * self.num_processes if self.batch_size is not None else None
        position = {
            "format": POSITION_FORMAT,
            "global_step": global_step,
            "epoch": epoch,
            "batch": batch,
            "end_of_epoch": end_of_epoch,
            "batch_size": self.batch_size,
            "num_processes": self.num_processes,
            "samples_in_epoch": samples,
            "num_workers": self.num_workers,
            "kind": self.kind,
            "restore": restore,
            "dataset": self.dataset_name,
        }
        return DataPositionRecord(position, state_json, tensors)


@dataclass(frozen=True)
class ContinueAt:
    """A resume's pending start: batch `batch` of the next iteration, from the loader state recorded there."""

    batch: int
    state: dict[str, Any]
    after_first_fetch: Callable[[], None] | None


def calling_after_first(iterator: Iterator[Any], callback: Callable[[], None]) -> Iterator[Any]:
    """`iterator`'s items, with `callback()` run once the first has been drawn (or the iterator found empty)."""
    try:
        first = next(iterator)
    except StopIteration:
        callback()
        return
    callback()
    yield first
    yield from iterator
