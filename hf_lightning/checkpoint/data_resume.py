"""Where a resumed run's train data continues: the checkpoint's data position (data/position_files.py) weighed
against the reference's arithmetic, and what is said about it before training.

The reference places a resume at epoch `global_step // updates_per_epoch`, batch `(global_step % updates_per_epoch)
x accumulation`. For a map-style dataset that is where the data stood. For an IterableDataset without a length the
reference takes `max_steps` updates as one epoch, so after the first pass it places the resume in pass 0 and starts
the next pass from its first batch (transformers #26413). The recorded position knows the pass and the batch: it is
used where it applies (the same step, batch size, processes; for a sized dataset the same place as the
reference's), with the loader state recorded there. Where it does not apply, the reference's place is used and the
batches before it are replayed, and the run says so before training, naming the dataset and why.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from hf_lightning.data.position_files import (
    DATA_POSITION_NAME,
    data_state_file_name,
    read_data_position,
    read_data_state,
)
from hf_lightning.data.sized import has_length

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SavedDataPosition:
    """A checkpoint's data position and this process's loader state (None when it has none)."""

    position: dict[str, Any]
    state: Any | None


def read_saved_position(checkpoint: str, world_size: int, process_index: int) -> SavedDataPosition | None:
    """The data position `checkpoint` holds for this process (read at `train()` entry; a damaged file raises a
    ValueError naming it), or None when it has none."""
    path = os.path.join(checkpoint, DATA_POSITION_NAME)
    if not os.path.isfile(path):
        return None
    position = read_data_position(path)
    state_path = os.path.join(checkpoint, data_state_file_name(world_size, process_index))
    return SavedDataPosition(position, read_data_state(state_path) if os.path.isfile(state_path) else None)


@dataclass(frozen=True)
class DataContinuation:
    """Where the resumed run's data continues: batch `batch` of pass `epoch`, from `state` when one applies (else
    the loader skips by index or replays the batches before it)."""

    epoch: int
    batch: int
    state: Any | None = None


def plan_continuation(
    saved: SavedDataPosition | None,
    loader: Any,
    *,
    global_step: int,
    reference_epoch: int,
    reference_batch: int,
) -> DataContinuation:
    """The resumed data's pass, batch and loader state, and the one message before training where the resume is not
    flat and exact."""
    chosen = _continuation(
        saved, loader, global_step=global_step, reference_epoch=reference_epoch, reference_batch=reference_batch
    )
    persistent = getattr(loader, "num_workers", 0) and getattr(loader, "persistent_workers", False)
    if chosen.epoch and not chosen.batch and persistent:
        name = getattr(getattr(loader, "positions", None), "dataset_name", None) or type(loader.dataset).__name__
        logger.warning(
            f"Resuming at the start of pass {chosen.epoch} over the train dataset ({name}) "
            "with dataloader_persistent_workers=True: the uninterrupted run's workers carry their random state and "
            "the loader's seed over from the previous pass, the resumed run starts new ones (as transformers.Trainer "
            "does), so the random numbers drawn after the resume (dropout, random collation in the workers) may "
            "differ from the uninterrupted run's."
        )
    return chosen


def _continuation(
    saved: SavedDataPosition | None, loader: Any, *, global_step: int, reference_epoch: int, reference_batch: int
) -> DataContinuation:
    reference = DataContinuation(reference_epoch, reference_batch)
    positions = getattr(loader, "positions", None)
    if positions is None:
        return reference  # a loader that records nothing (a user's, or shared across processes): the reference's way
    if saved is None:
        _say_replay(positions, reference_batch, "the checkpoint holds no data position (written by transformers or an "
                    "older hf_lightning)")  # fmt: skip
        return reference
    position = saved.position
    mismatch = _mismatch(position, positions, global_step)
    if mismatch is not None:
        if reference_batch:
            logger.warning(
                f"Resuming the train dataset ({positions.dataset_name}) with {mismatch}: the data position saved with "
                f"the checkpoint does not apply, so the {reference_batch} batches before the resume point are "
                "replayed as transformers.Trainer does, and the data after it may not be the uninterrupted run's."
            )
        return reference
    if has_length(loader):
        if (position["epoch"], position["batch"]) != (reference_epoch, reference_batch):
            return reference  # e.g. another accumulation: the reference's place, skipped by index
        chosen = DataContinuation(reference_epoch, reference_batch, saved.state)
    else:
        chosen = DataContinuation(position["epoch"], position["batch"], saved.state)
    if chosen.batch and positions.restore == "replay" and positions.reason:
        logger.warning(
            f"The train dataset ({positions.dataset_name}) cannot be resumed exactly ({positions.reason}): the "
            f"{chosen.batch} batches before the resume point are replayed as transformers.Trainer does, and the "
            "batches after it may not be the uninterrupted run's."
        )
    elif chosen.batch and chosen.state is None and positions.stateful:
        _say_replay(positions, chosen.batch, "the checkpoint holds no loader state for this process")
    elif chosen.batch and positions.restore == "examples_drawn":
        examples = chosen.batch * (positions.batch_size or 1)
        logger.warning(
            f"The train dataset ({positions.dataset_name}) cannot be put back at its position ({positions.reason}); "
            f"to continue exactly, the resume draws the {examples} examples already trained on in this pass again, "
            "without collating them, so its cost grows with the position."
        )
    return chosen


def _mismatch(position: dict[str, Any], positions: Any, global_step: int) -> str | None:
    """What differs between the recorded position and this run's loader (None when it applies)."""
    if position["global_step"] != global_step:
        return f"a data position written at step {position['global_step']}, not at the checkpoint's {global_step}"
    for key, ours in (
        ("batch_size", positions.batch_size),
        ("num_processes", positions.num_processes),
        ("num_workers", positions.num_workers),
    ):
        if position.get(key) != ours:
            name = {"num_processes": "processes", "num_workers": "dataloader_num_workers"}.get(key, key)
            return f"{name}={ours} (the checkpoint's was {position.get(key)})"
    if position.get("kind") != positions.kind:
        return f"a {positions.kind}-style dataset (the checkpoint's was {position.get('kind')}-style)"
    return None


def _say_replay(positions: Any, batches: int, why: str) -> None:
    if batches and positions.kind == "iterable":
        logger.warning(
            f"Resuming into the train dataset ({positions.dataset_name}): {why}, so the {batches} batches already "
            "trained on in this pass are drawn again, as transformers.Trainer does."
        )
