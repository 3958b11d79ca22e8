"""Lightning's per-step machinery without two parts that can do nothing for this engine's fits.

The profiler: Lightning wraps every hook, strategy call and training batch in `trainer.profiler.profile(name)`, a
`contextlib.contextmanager` generator that calls `start` / `stop`. With the default `PassThroughProfiler` both do
nothing, yet each wrap costs about eight Python calls, some fourteen times per step (the `tiny` workload in
benchmarks/). `LeanPassThroughProfiler` returns one shared no-op context instead; a profiler the user chose
(`lightning_trainer_overrides={"profiler": ...}`, a subclass of the pass-through one included) is left alone.

The epoch loop: after every batch it asks, twice, whether Lightning should step a scheduler, and whether to
validate; under manual optimization (always ours: the module steps the reference's scheduler itself) and with a
module that has no `validation_step` (the facade evaluates) both answers are no, after some ten calls each.
`LeanTrainingEpochLoop` answers them at once, and skips the fetch profiling the lean profiler would ignore.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loops import _TrainingEpochLoop
from lightning.pytorch.profilers import PassThroughProfiler

__all__ = [
    "LeanPassThroughProfiler",
    "LeanTrainingEpochLoop",
    "is_pass_through_profiler",
    "use_lean_epoch_loop",
    "use_lean_profiler",
]


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


class LeanTrainingEpochLoop(_TrainingEpochLoop):
    """`_TrainingEpochLoop` answering three per-batch questions at once when the answer cannot depend on the batch."""

    def update_lr_schedulers(self, interval: str, update_plateau_schedulers: bool) -> None:
        # Lightning's `_update_learning_rates` returns without stepping anything under manual optimization.
        if self.trainer.lightning_module.automatic_optimization:
            super().update_lr_schedulers(interval, update_plateau_schedulers)

    def _should_check_val_fx(self, data_fetcher: Any) -> bool:
        # Lightning validates only a module overriding `validation_step` (`Trainer.enable_validation`); the
        # engine's module does not (the facade evaluates), so this is False unless a subclass does.
        if type(self.trainer.lightning_module).validation_step is pl.LightningModule.validation_step:
            return False
        return super()._should_check_val_fx(data_fetcher)

    def _on_before_fetch(self) -> None:
        if type(self.trainer.profiler) is not LeanPassThroughProfiler:  # else `start` would do nothing
            super()._on_before_fetch()

    def _on_after_fetch(self) -> None:
        if type(self.trainer.profiler) is not LeanPassThroughProfiler:
            super()._on_after_fetch()


def use_lean_epoch_loop(trainer: pl.Trainer) -> None:
    """Give `trainer`'s fit loop the lean epoch loop, keeping the state `Trainer.__init__` configured on its own."""
    loop = trainer.fit_loop.epoch_loop
    if type(loop) is _TrainingEpochLoop:
        loop.__class__ = LeanTrainingEpochLoop
