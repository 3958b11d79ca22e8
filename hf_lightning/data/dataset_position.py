"""Resuming an iterable dataset's epoch from its recorded position instead of replaying the batches before it.

The reference fast-forwards an IterableDataset by drawing and discarding every batch already trained on
(transformers issues #11284, #18649: hours on a large streamed dataset). A dataset that follows torch's Stateful
protocol (`state_dict()` says where its iteration stands, `load_state_dict()` makes the next iteration start
there), as HF datasets' IterableDataset does, can instead be put back where it was. While the train loader reads
such a dataset, the position before each batch is recorded; a checkpoint keeps the last few in
`DATASET_POSITION_NAME` (JSON: nothing pickled is written or read) and a resume that must skip B batches loads the
position before batch B. Only where that yields exactly what the replay would: the main process reads the dataset
(no workers), the collator is known to have no side effects, and no shuffle buffer (which HF datasets does not
restore) sits in the dataset. Otherwise the batches are replayed as before (docs/divergences.md).
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset

from hf_lightning.data.collate import collates_without_side_effects

logger = logging.getLogger(__name__)

DATASET_POSITION_NAME = "hf_lightning_dataset_position.json"
# Positions kept: the batches the loaders have drawn ahead of training (ours and Lightning's one each) and a margin.
_RECENT_POSITIONS = 8


def position_restorable(loader: Any) -> bool:
    """Whether `loader`'s IterableDataset can be put back to a recorded position with the same result as a replay."""
    dataset = getattr(loader, "dataset", None)
    if not isinstance(dataset, IterableDataset):
        return False
    if not (callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None))):
        return False
    if getattr(loader, "num_workers", 0) != 0:
        return False  # each worker iterates its own copy: the main process's dataset does not move
    if _hf_datasets_restore_is_inexact(dataset):
        return False
    return collates_without_side_effects(getattr(loader, "collate_fn", None))


def _hf_datasets_restore_is_inexact(dataset: Any) -> bool:
    """The two cases HF datasets' `IterableDataset.state_dict` documents as not resuming exactly: a shuffle buffer
    (its examples are lost) and the arrow format over a batched `map` (a batch may be skipped)."""
    stages = _example_iterables(getattr(dataset, "_ex_iterable", None))
    if any(type(stage).__name__ == "BufferShuffledExamplesIterable" for stage in stages):
        return True
    formatting = getattr(dataset, "_formatting", None)
    arrow = getattr(formatting, "format_type", None) == "arrow"
    return arrow and any(getattr(stage, "batched", False) for stage in stages)


def _example_iterables(stage: Any, depth: int = 0) -> list[Any]:
    """An HF datasets IterableDataset's chain of example iterables (each wraps `ex_iterable` or `ex_iterables`)."""
    if stage is None or depth > 64:
        return []
    inner = [getattr(stage, "ex_iterable", None), *(getattr(stage, "ex_iterables", None) or [])]
    return [stage, *(found for child in inner for found in _example_iterables(child, depth + 1))]


class DatasetPositions:
    """The dataset's position before each of the last batches drawn in the current epoch.

    Positions count batches of `batch_size` examples: the record keeps it, and a resume at another batch size
    replays (batch B at another size is another example).
    """

    def __init__(self, dataset: Any, batch_size: int | None) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.epoch: int | None = None
        self.recent: deque[tuple[int, Any]] = deque(maxlen=_RECENT_POSITIONS)

    def recording(
        self,
        batches: Iterator[Any],
        epoch: int,
        first_index: int,
        first_state: Any | None = None,
        loaded: bool = False,
    ) -> Iterator[Any]:
        """Yield `batches` (epoch `epoch`, starting at batch `first_index`), recording the position before each.

        The position before batch i+1 is read right after batch i is drawn: before its iterator has started, a
        dataset's `state_dict()` says nothing about the coming iteration (HF datasets returns the previous one's
        state). `first_state` is the position before batch `first_index` when it is known (the position the
        iteration was resumed at, or the state after the replayed batches); at an epoch's start none is needed
        (a resume at batch 0 loads nothing). `loaded`: this iteration started from a loaded position, which is
        forgotten once the first batch is drawn (`forget_loaded_position`).
        """
        self.epoch = epoch
        self.recent.clear()
        if first_state is not None:
            self.recent.append((first_index, first_state))
        index = first_index
        for batch in batches:
            if loaded:
                forget_loaded_position(self.dataset)
                loaded = False
            index += 1
            self.recent.append((index, self.dataset.state_dict()))
            yield batch

    def record(self) -> dict[str, Any] | None:
        """What a checkpoint keeps: `{"epoch": e, "batch_size": b, "positions": [[batch, state], ...]}`, None when
        there is nothing to keep or a state is not plain JSON (a resume then replays)."""
        if self.epoch is None or not self.recent:
            return None
        record = {
            "epoch": self.epoch,
            "batch_size": self.batch_size,
            "positions": [[index, state] for index, state in self.recent],
        }
        try:
            return json.loads(json.dumps(record))  # a copy that later batches do not change
        except (TypeError, ValueError):
            logger.debug("The dataset's state_dict() is not plain JSON; a resume replays the batches instead.")
            return None


def forget_loaded_position(dataset: Any) -> None:
    """Once the resumed iteration has started: HF datasets' IterableDataset keeps a loaded state and starts every
    later iteration of the same epoch there (its `__iter__` applies `_starting_state_dict` while the epoch matches),
    so an evaluation on the same object, a restarted `train()` or the user's own loop would start mid-stream. Our
    contract, torch's Stateful one, is that a loaded position applies to the next iteration only."""
    if getattr(dataset, "_starting_state_dict", None) is not None:
        dataset._starting_state_dict = None


def position_before(record: dict[str, Any] | None, epoch: int, batch: int, batch_size: int | None) -> Any | None:
    """The recorded state before batch `batch` of epoch `epoch` for batches of `batch_size`, or None when the
    record does not hold it (another pass, another batch size, a batch outside the recorded window)."""
    if not record or record.get("epoch") != epoch or record.get("batch_size") != batch_size:
        return None
    for index, state in record.get("positions", []):
        if index == batch:
            return state
    return None


def position_record_problem(path: str) -> str | None:
    """Why the record at `path` cannot be used (naming the file and the fix), or None when it reads as a record.

    Checked where every checkpoint file is (checkpoint/files.py `checkpoint_problem`), so `resume_from_checkpoint=True`
    passes over a checkpoint whose record is damaged and an explicit resume is refused before training.
    """
    try:
        read_position_record(path)
    except ValueError as error:
        return str(error)
    return None


def read_position_record(path: str) -> dict[str, Any]:
    """The record written by a checkpoint, checked for its shape; a damaged file is refused, naming it."""
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError) as error:
        raise ValueError(_damaged(path, f"it cannot be read as JSON ({error})")) from error
    positions = record.get("positions") if isinstance(record, dict) else None
    if not isinstance(record, dict) or not isinstance(record.get("epoch"), int) or not isinstance(positions, list):
        raise ValueError(_damaged(path, 'it is not {"epoch": <int>, "positions": [[<batch>, <state>], ...]}'))
    if not isinstance(record.get("batch_size"), (int, type(None))):
        raise ValueError(_damaged(path, "`batch_size` is not an integer"))
    if not all(isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], int) for entry in positions):
        raise ValueError(_damaged(path, "an entry of `positions` is not [<batch index>, <state>]"))
    return record


def write_position_record(path: str, record: dict[str, Any]) -> None:
    """Write the record (the checkpoint's commit makes it durable with the other files)."""
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(record, handle)


def _damaged(path: str, reason: str) -> str:
    return (
        f"{path}: the dataset position saved with this checkpoint is damaged: {reason}. Delete the file to resume "
        "by replaying the epoch's batches instead."
    )
