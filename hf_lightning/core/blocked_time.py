"""Time during which training stood still for something other than its own steps: evaluation, a checkpoint save, a
Hub push, generation (GRPO / RLOO). The telemetry (engine/telemetry/) reports each cause as a share of wall time.

In `core/` because the places that block sit in several layers (checkpoint/, evaluation/, integrations/, trl/) and
none of them may import the engine: each wraps its blocking call in `blocked_by(trainer, cause)`, which reads the
trainer's telemetry (`TelemetryOwner`, the port below) and does nothing when it is off.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Protocol

# The causes the telemetry names, in the order its summary lists them.
CAUSES = ("evaluation", "checkpoint", "hub", "generation")


class BlockedTime:
    """Seconds spent per cause. Nested causes count once, to the innermost: a Hub push made inside a save is Hub
    time, not also save time, so the shares never add up to more than the wall time."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(CAUSES, 0.0)
        self._nested: list[float] = []  # per open cause: the seconds its nested causes took

    @contextlib.contextmanager
    def measure(self, cause: str) -> Iterator[None]:
        """Count the block's wall time (less its nested causes) to `cause`."""
        if cause not in self.seconds:
            raise ValueError(f"unknown cause of blocked time {cause!r}; one of {', '.join(CAUSES)}")
        started = time.perf_counter()
        self._nested.append(0.0)
        try:
            yield
        finally:
            nested = self._nested.pop()
            elapsed = time.perf_counter() - started
            self.seconds[cause] += elapsed - nested
            if self._nested:
                self._nested[-1] += elapsed

    def take(self) -> dict[str, float]:
        """The seconds per cause since the last `take`, and start again from zero (open blocks keep counting)."""
        taken, self.seconds = self.seconds, dict.fromkeys(CAUSES, 0.0)
        return taken


class BlockedTimeMeter(Protocol):
    """What `blocked_by` uses of the trainer's telemetry (engine/telemetry/meter.py's `TelemetryMeter`)."""

    blocked: BlockedTime


class TelemetryOwner(Protocol):
    """The trainer as `blocked_by` sees it: its telemetry, None when switched off."""

    _telemetry: BlockedTimeMeter | None


def blocked_by(owner: TelemetryOwner, cause: str) -> contextlib.AbstractContextManager[None]:
    """A context counting its time to `cause` in `owner`'s telemetry (the trainer's `_telemetry`); a no-op when the
    telemetry is off."""
    telemetry = owner._telemetry
    if telemetry is None:
        return contextlib.nullcontext()
    return telemetry.blocked.measure(cause)
