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

The batch itself: Lightning's `advance` reaches the module's `training_step` through three generic dispatchers
(callback hooks, module hooks, strategy hooks), each logging a debug line, formatting a profiler action name and
saving `_current_fx_name`, and through the manual-optimization loop's `run`. When the profiler is the lean one,
Lightning validates nothing and the strategy keeps the no-op `on_train_batch_start`, `advance` runs the same
steps in the same order, calling only the callbacks that override a batch hook (the base hooks are empty):
`_lean_batch` below, Lightning 2.6's `_TrainingEpochLoop.advance` and `_ManualOptimization.run` written out
for that case. With the module unwrapped and a precision plugin whose training-step context is the base empty
one, the strategy's `training_step` would only call the module's, so the module's is called (two context managers
and five property reads fewer per step). Anything else (a restart from a Lightning checkpoint, another profiler, a
validating module) takes Lightning's own path.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.precision import Precision as FabricPrecision
from lightning.pytorch.loops import _TrainingEpochLoop
from lightning.pytorch.loops.fetchers import _DataLoaderIterDataFetcher
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.model_helpers import is_overridden

from hf_lightning.engine.base_methods import is_base_method

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


class _BatchHooks:
    """What a lean batch calls, found once per epoch: the Lightning callbacks overriding `on_train_batch_start` /
    `on_train_batch_end`, and whether the strategy's `training_step` and `post_training_step` can be skipped."""

    __slots__ = ("batch_start", "batch_end", "module_step_directly", "post_training_step", "many_processes")

    def __init__(self, trainer: pl.Trainer) -> None:
        callbacks = trainer.callbacks
        self.batch_start = [c for c in callbacks if is_overridden("on_train_batch_start", c, pl.Callback)]
        self.batch_end = [c for c in callbacks if is_overridden("on_train_batch_end", c, pl.Callback)]
        strategy = trainer.strategy
        self.module_step_directly = _strategy_step_is_module_step(strategy)
        post_step = strategy.post_training_step
        self.post_training_step = None if is_base_method(post_step, _BASE_POST_TRAINING_STEP) else post_step
        self.many_processes = trainer.world_size > 1  # fixed for the fit: one process never broadcasts SIGTERM


# Lightning's base methods as this module found them: an override on a class or an instance, or a class-level
# patch made later, is then told apart from them.
_BASE_TRAINING_STEP = Strategy.training_step
_BASE_POST_TRAINING_STEP = Strategy.post_training_step
_BASE_TRAIN_STEP_CONTEXT = Precision.train_step_context
_BASE_FORWARD_CONTEXT = FabricPrecision.forward_context


def _strategy_step_is_module_step(strategy: Strategy) -> bool:
    """Whether `strategy.training_step(...)` is the module's own `training_step(...)`: Lightning's base method, the
    module not wrapped and a precision plugin whose training-step context is its base empty one."""
    precision = strategy.precision_plugin
    return (
        is_base_method(strategy.training_step, _BASE_TRAINING_STEP)
        and strategy.model is strategy.lightning_module
        and is_base_method(precision.train_step_context, _BASE_TRAIN_STEP_CONTEXT)
        and is_base_method(precision.forward_context, _BASE_FORWARD_CONTEXT)
    )


def _lean_batch_hooks(trainer: pl.Trainer) -> _BatchHooks | None:
    """The callbacks to call when a batch can take the lean path (see the module docstring), else None."""
    module = trainer.lightning_module
    if (
        type(trainer.profiler) is not LeanPassThroughProfiler
        or module.automatic_optimization
        or trainer.accumulate_grad_batches != 1
        or type(module).validation_step is not pl.LightningModule.validation_step
        or type(trainer.strategy).on_train_batch_start is not Strategy.on_train_batch_start
    ):
        return None
    return _BatchHooks(trainer)


class LeanTrainingEpochLoop(_TrainingEpochLoop):
    """`_TrainingEpochLoop` answering three per-batch questions at once when the answer cannot depend on the batch,
    and running a batch without the generic hook dispatch when nothing could tell (the module docstring)."""

    _lean_hooks: _BatchHooks | None = None

    def on_run_start(self, data_fetcher: Any) -> None:
        super().on_run_start(data_fetcher)
        self._lean_hooks = _lean_batch_hooks(self.trainer)

    def advance(self, data_fetcher: Any) -> None:
        hooks = self._lean_hooks
        if hooks is None or self.restarting or not isinstance(data_fetcher, _DataLoaderIterDataFetcher):
            super().advance(data_fetcher)
        else:
            self._lean_batch(data_fetcher, hooks)

    def _lean_batch(self, data_fetcher: _DataLoaderIterDataFetcher, hooks: _BatchHooks) -> None:
        """Lightning's `advance` for a `dataloader_iter` step under manual optimization, hooks called directly."""
        self.val_loop.restarting = False
        trainer = self.trainer
        if hooks.many_processes and torch.distributed.is_available() and torch.distributed.is_initialized():
            self._broadcast_sigterm_tensor()
        dataloader_iter = next(data_fetcher)
        batch, batch_idx = data_fetcher._batch, data_fetcher._batch_idx
        progress = self.batch_progress
        progress.is_last_batch = data_fetcher.done
        progress.increment_ready()
        trainer._logger_connector.on_batch_start(batch)
        module = trainer.lightning_module
        previous_fx_name = module._current_fx_name
        module._current_fx_name = "on_train_batch_start"
        for callback in hooks.batch_start:
            callback.on_train_batch_start(trainer, module, batch, batch_idx)
        response = module.on_train_batch_start(batch, batch_idx)
        module._current_fx_name = previous_fx_name
        if response == -1:  # the epoch ends here; Lightning counts the batch processed, then stops
            progress.increment_by(0, is_last_batch=True)
            progress.increment_processed()
            raise StopIteration
        progress.increment_started()
        batch_output = self._lean_manual_run(trainer, module, dataloader_iter, hooks)
        progress.increment_processed()
        batch, batch_idx = data_fetcher._batch, data_fetcher._batch_idx  # the step drew from the iterator
        progress.is_last_batch = data_fetcher.done
        module._current_fx_name = "on_train_batch_end"
        for callback in hooks.batch_end:
            callback.on_train_batch_end(trainer, module, batch_output, batch, batch_idx)
        module.on_train_batch_end(batch_output, batch, batch_idx)
        module._current_fx_name = previous_fx_name
        trainer._logger_connector.on_batch_end()
        progress.increment_completed()
        trainer._logger_connector.update_train_step_metrics()

    def _lean_manual_run(
        self, trainer: pl.Trainer, module: pl.LightningModule, dataloader_iter: Any, hooks: _BatchHooks
    ) -> Any:
        """`_ManualOptimization.run` with the strategy's `training_step` called directly, or the module's when the
        strategy's would only call it (`_strategy_step_is_module_step`)."""
        manual = self.manual_optimization
        manual.on_run_start()
        with suppress(StopIteration):
            previous_fx_name = module._current_fx_name
            module._current_fx_name = "training_step"
            if hooks.module_step_directly:
                output = module.training_step(dataloader_iter)
            else:
                output = trainer.strategy.training_step(dataloader_iter)
            module._current_fx_name = previous_fx_name
            if hooks.post_training_step is not None:  # Lightning's base one is empty
                hooks.post_training_step()
            manual._output = manual.output_result_cls.from_training_step_output(output).asdict()
        manual._restarting = False
        return manual.on_run_end()

    def on_advance_end(self, data_fetcher: Any) -> None:
        if self._lean_hooks is None or self.restarting or self._skip_next_val:
            super().on_advance_end(data_fetcher)
            return
        # Lightning's, with no validation to run and no scheduler to step (`_lean_batch_hooks` made sure), and a
        # manual optimization that never accumulates (`accumulate_grad_batches` is 1).
        self._batches_that_stepped += 1
        self._save_loggers_on_train_batch_end()
        if self.trainer.received_sigterm and not self._is_training_done:
            raise SIGTERMException

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
