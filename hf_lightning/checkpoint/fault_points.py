"""Named fault points: where the checkpoint saves and the training step let a test raise, kill or pause a process.

Every save passes the points of `SAVE_POINTS` in order, and each optimizer update ends at `step:<global_step>`
(after its log, evaluation and save); `reach(point)` does nothing unless a test armed it, with `fault_hook` in the
process or through the environment for a child process (`HF_LIGHTNING_KILL_AT`, `HF_LIGHTNING_PAUSE_AT`). The
decisions' "named, repeatable kill points" live here, apart from the folder layout (checkpoint/files.py).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

# Every named point a checkpoint save passes, in order (the decisions' "named, repeatable kill points").
SAVE_POINTS = (
    "model",
    "processing_class",
    "training_args",
    "optimizer",
    "scheduler",
    "rng",
    "trainer_state",
    "fsync",
    "marker",
    "rename_aside",
    "rename",
    "delete_aside",
    "rotate",
)
_fault_hook: Callable[[str], None] | None = None

# `HF_LIGHTNING_KILL_AT="<point>"` or `"<point>#<n>"`: SIGKILL this process the first (n-th) time it reaches
# `<point>`: a save point above, or `step:<global_step>` after an optimizer update's log/evaluate/save.
# `HF_LIGHTNING_KILL_SIGNAL` names another signal to send (e.g. `SIGTERM`).
KILL_AT_ENV = "HF_LIGHTNING_KILL_AT"
KILL_SIGNAL_ENV = "HF_LIGHTNING_KILL_SIGNAL"
# `HF_LIGHTNING_PAUSE_AT` (same syntax) with `HF_LIGHTNING_PAUSE_FDS="<write fd>,<read fd>"`: at that point,
# write the point's name and a newline to the first descriptor, then block until a line arrives on the second,
# so a test can send this process a signal while it stands at a known point.
PAUSE_AT_ENV = "HF_LIGHTNING_PAUSE_AT"
PAUSE_FDS_ENV = "HF_LIGHTNING_PAUSE_FDS"
_times_reached: dict[str, int] = {}


def faults_armed() -> bool:
    """Whether `reach` could do anything now: a fault hook is installed or a kill / pause point is selected.
    The training step reads it once per fit, so `step:<N>` points must be armed before `train()` starts."""
    return _fault_hook is not None or bool(os.environ.get(KILL_AT_ENV) or os.environ.get(PAUSE_AT_ENV))


def reach(point: str) -> None:
    """Mark that a save (or a step boundary) reached `point`; a fault test may raise, kill or pause there."""
    if _fault_hook is not None:
        _fault_hook(point)
    kill_at = os.environ.get(KILL_AT_ENV)
    pause_at = os.environ.get(PAUSE_AT_ENV)
    if not (kill_at or pause_at):
        return
    _times_reached[point] = _times_reached.get(point, 0) + 1
    if kill_at and _selects(kill_at, point):
        _kill_this_process()
    if pause_at and _selects(pause_at, point):
        _pause(point)


def _selects(selector: str, point: str) -> bool:
    name, _, nth = selector.partition("#")
    return name == point and _times_reached[point] == int(nth or 1)


def _pause(point: str) -> None:
    write_fd, read_fd = (int(fd) for fd in os.environ[PAUSE_FDS_ENV].split(","))
    os.write(write_fd, f"{point}\n".encode())
    os.read(read_fd, 1)  # a signal handler runs here; the read resumes after it (PEP 475)


def _kill_this_process() -> None:
    import signal

    name = os.environ.get(KILL_SIGNAL_ENV)
    if name:
        os.kill(os.getpid(), getattr(signal, name))
        return
    sigkill = getattr(signal, "SIGKILL", None)
    if sigkill is None:  # no SIGKILL (Windows): exit at once, no cleanup either
        os._exit(137)
    os.kill(os.getpid(), sigkill)


@contextlib.contextmanager
def fault_hook(hook: Callable[[str], None]) -> Iterator[None]:
    """Install `hook(point)` for the duration of the block (fault-injection tests only)."""
    global _fault_hook
    previous, _fault_hook = _fault_hook, hook
    try:
        yield
    finally:
        _fault_hook = previous
