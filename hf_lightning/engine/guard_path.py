"""The windows a run guard took out of a run's path: recorded, carried in checkpoints, drawn past on a replay.

A window taken out (`skip`, or the offending window of a `rollback`) is a run of micro-batches at positions
`first .. first + count - 1` of epoch `epoch` in the train loader's order (per process). The run's path is then the
one of a run whose sampler order lacks them: no update is made from them, and a replay (a rollback, or a resume from
a checkpoint written before them) draws them from the loader and discards them. `at_step` is the update count
before the window; a checkpoint at step S was written after every window with `at_step < S`, so its data stands
`global_step + that count` windows into training (what `checkpoint/resume.py` reads from the data-position file).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hf_lightning.checkpoint.files import is_complete_checkpoint, list_checkpoints
from hf_lightning.data.sized import has_length


@dataclass(frozen=True)
class SkippedWindow:
    """One window taken out of the path: epoch, first micro-batch position, micro-batch count, updates before it."""

    epoch: int
    first: int
    count: int
    at_step: int

    def as_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "first": self.first, "count": self.count, "at_step": self.at_step}


class SkippedWindows:
    """The run's windows taken out, by position (looked up before each window while any exists)."""

    def __init__(self) -> None:
        self.records: list[SkippedWindow] = []
        self._by_position: dict[tuple[int, int], int] = {}

    def __bool__(self) -> bool:
        return bool(self.records)

    def add(self, window: SkippedWindow) -> None:
        if (window.epoch, window.first) not in self._by_position:
            self.records.append(window)
            self._by_position[(window.epoch, window.first)] = window.count

    def merge(self, entries: list[dict[str, int]] | None) -> None:
        """The windows a checkpoint's data position recorded (resuming from it)."""
        for entry in entries or []:
            self.add(SkippedWindow(int(entry["epoch"]), int(entry["first"]), int(entry["count"]), int(entry["at_step"])))

    def count_at(self, epoch: int, first: int) -> int | None:
        return self._by_position.get((epoch, first))

    def as_json(self) -> list[dict[str, int]]:
        return [window.as_dict() for window in self.records]


def discard_skipped_windows(module: Any, run: Any, dataloader_iter: Iterator) -> bool:
    """Before a window is drawn: draw and discard the windows taken out that start at the next position (their
    micro-batches count as consumed, their update as done for the epoch's window count). True when the epoch has no
    window left after them."""
    epoch = module.current_epoch
    while True:
        count = run.skipped_windows.count_at(epoch, module._micro_batch_index + 1)
        if count is None:
            return False
        for _ in range(count):
            try:
                next(dataloader_iter)
            except StopIteration:
                break
        module._micro_batch_index += count
        if windows_end_epochs(run):
            run.updates_done_in_epoch += 1
            if run.updates_done_in_epoch >= run.values.num_update_steps_per_epoch:
                return True


def windows_end_epochs(run: Any) -> bool:
    """Whether a window taken out counts toward the epoch's windows: with sized data the epoch is the sampler's
    order (a run lacking the window has one window fewer); an unsized one's pass is `max_steps` updates."""
    return has_length(run.facade.callback_handler.train_dataloader)


def checkpoint_before(run_dir: str, step: int) -> tuple[int, str] | None:
    """The newest complete checkpoint of `run_dir` written before update `step` (its weights predate it), or None."""
    for saved_step, path in reversed(list_checkpoints(run_dir)):
        if saved_step < step and is_complete_checkpoint(path):
            return saved_step, path
    return None
