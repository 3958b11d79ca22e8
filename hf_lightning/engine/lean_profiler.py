"""Lightning's default pass-through profiler without its per-hook context-manager machinery.

Lightning wraps every hook, strategy call and training batch in `trainer.profiler.profile(name)`, a
`contextlib.contextmanager` generator that calls `start` / `stop`. With the default `PassThroughProfiler` both do
nothing, yet each wrap costs about eight Python calls, some fourteen times per step (the `tiny` workload in
benchmarks/). `LeanPassThroughProfiler` returns one shared no-op context instead; a profiler the user chose
(`lightning_trainer_overrides={"profiler": ...}`, a subclass of the pass-through one included) is left alone.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.profilers import PassThroughProfiler

__all__ = ["LeanPassThroughProfiler", "is_pass_through_profiler", "use_lean_profiler"]


class _NoAction:
    """A reusable context that does nothing (what `profile` amounts to when `start` and `stop` are empty)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: Any) -> None:
        return None


_NO_ACTION = _NoAction()


class LeanPassThroughProfiler(PassThroughProfiler):
    """`PassThroughProfiler` whose `profile(name)` is one shared no-op context."""

    def profile(self, action_name: str) -> _NoAction:  # type: ignore[override]
        return _NO_ACTION


def is_pass_through_profiler(profiler: Any) -> bool:
    """Whether `profiler` records nothing: Lightning's default one or its lean stand-in (not a subclass)."""
    return type(profiler) is PassThroughProfiler or type(profiler) is LeanPassThroughProfiler


def use_lean_profiler(trainer: pl.Trainer) -> None:
    """Give `trainer` the lean profiler when it has Lightning's default one (nothing to record either way)."""
    if type(trainer.profiler) is PassThroughProfiler:
        trainer.profiler.__class__ = LeanPassThroughProfiler
