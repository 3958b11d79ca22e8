"""The LightningModule that runs the reference Trainer's update step on Lightning's loop.

One Lightning `training_step` is one optimizer update (manual optimization, see docs/design.md):
it pulls the accumulation window through the facade's `get_batch_samples`, runs each micro-batch
through the facade's `training_step`, clips, steps the optimizer through Lightning, steps the
scheduler and hands the step boundary back to the facade, which logs, evaluates and saves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.strategies import Strategy

import hf_lightning.engine.schedule as schedule
from hf_lightning.checkpoint.fault_points import faults_armed, reach
from hf_lightning.core.autocast import planned_autocast_dtype
from hf_lightning.engine.guard_path import discard_skipped_windows
from hf_lightning.engine.held_gradients import HeldGradients
from hf_lightning.engine.input_checks import empty_epoch_error
from hf_lightning.engine.loss import ItemCountSource, UnusedItemCountProbe
from hf_lightning.engine.precision import forward_autocast
from hf_lightning.engine.run_guard import GuardedTrainer
from hf_lightning.engine.update_dispatch import UpdateDispatch
from hf_lightning.strategies.fsdp.policies import gradient_sync_disabled

if TYPE_CHECKING:
    from torch import nn

    from hf_lightning.callbacks import CallbackHandler
    from hf_lightning.checkpoint.resume import Resumer
    from hf_lightning.engine.guard_path import SkippedWindows
    from hf_lightning.engine.run_guard import RunGuard
    from hf_lightning.engine.telemetry.meter import TelemetryMeter


class StepHooks(ItemCountSource, GuardedTrainer, Protocol):
    """The trainer as the Lightning module sees it: the reference-named step methods a subclass may override, the
    model, optimizer and scheduler an update steps, and the state, control and counters it moves (what a strategy
    built is handed over onto it: `adopt_wrapped_model`, `adopt_engine`)."""

    model: nn.Module
    model_wrapped: nn.Module
    optimizer: Any  # torch's, or DeepSpeed's view (`adopt_optimizer_and_scheduler`)
    lr_scheduler: Any
    train_dataset: Any
    callback_handler: CallbackHandler  # its train dataloader (engine/guard_path.py)
    deepspeed: Any  # the DeepSpeed engine once built, None before (the hand-overs also set the strategy's flags)
    current_gradient_accumulation_steps: int
    current_flos: float
    reuse_gradient_memory: bool  # hold freed gradients for the next backward on CPU (engine/held_gradients.py)
    _telemetry: TelemetryMeter | None

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer: ...
    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None): ...
    def get_batch_samples(
        self, epoch_iterator: Iterator, num_batches: int, device: torch.device
    ) -> tuple[list, Any]: ...
    def training_step(
        self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None
    ) -> torch.Tensor: ...
    def floating_point_ops(self, inputs: dict[str, Any]) -> int: ...
    def _fire(self, event: str) -> None: ...
    def _on_epoch_begin(self, epoch: int) -> None: ...
    def _on_epoch_end(self, epoch: int, last_micro_batch_index: int) -> None: ...
    def _accumulate_loss(self, loss_step: torch.Tensor) -> None: ...
    def _track_num_input_tokens(self, inputs: dict[str, Any]) -> None: ...
    def _clip_grad_norm(self, model: nn.Module) -> float: ...
    def _get_learning_rate(self) -> float: ...
    def _scheduler_waits_for_metrics(self) -> bool: ...
    def _maybe_log_save_evaluate(self, grad_norm: Any, epoch: int, learning_rate: float | None = None) -> None: ...


class ModuleRun(Protocol):
    """The `train()` call as the Lightning module sees it (engine/training_run.py's `TrainingRun`): the schedule, the
    epoch's update count, the resume and guard components, and the last update's figures for the epoch-end log."""

    facade: StepHooks
    values: schedule.TrainingValues | None
    updates_done_in_epoch: int
    resume: Resumer
    guard: RunGuard | None
    skipped_windows: SkippedWindows
    last_grad_norm: Any
    last_learning_rate: float | None


class _BatchIterator(Iterator):
    """Lightning's dataloader iterator, yielding plain batches already moved to the device.

    Lightning's fetcher yields `(batch, batch_idx, dataloader_idx)`; the reference's epoch iterator
    yields device batches, which is what `get_batch_samples` and user overrides expect.
    """

    def __init__(self, lightning_iterator: Iterator, module: HFLightningModule, fit: _FitView):
        self._lightning_iterator = lightning_iterator
        self._module = module
        self._device = fit.root_device if module._plain_batch_transfer() else None

    def __next__(self) -> Any:
        batch, _, _ = next(self._lightning_iterator)
        if self._device is not None:
            # What Lightning's three default transfer hooks amount to, without dispatching them.
            return _moved_to_device(batch, self._device)
        trainer = self._module.trainer
        batch = self._module._on_before_batch_transfer(batch, dataloader_idx=0)
        return trainer.strategy.batch_to_device(batch, dataloader_idx=0)


def _moved_to_device(batch: Any, device: torch.device) -> Any:
    """`move_data_to_device(batch, device)`; a dict of plain tensors already there gets its result, a new dict of
    the same tensors, without the collection walk (the common case on one device)."""
    if type(batch) is dict:
        for value in batch.values():
            if type(value) is not torch.Tensor or value.device != device:
                break
        else:
            return dict(batch)
    return move_data_to_device(batch, device)


class _TimedBatchIterator(_BatchIterator):
    """`_BatchIterator` whose waits for the next batch (drawing it and moving it to the device) the telemetry's host
    clock times (engine/telemetry/)."""

    def __init__(self, lightning_iterator: Iterator, module: HFLightningModule, fit: _FitView):
        super().__init__(lightning_iterator, module, fit)
        self._clock = fit.data_clock

    def __next__(self) -> Any:
        clock = self._clock
        clock.start()
        try:
            return super().__next__()
        finally:
            clock.stop()


class _FitView:
    """What one fit's steps read from Lightning and the plan, looked up once (fixed once the fit has started)."""

    __slots__ = (
        "strategy", "root_device", "scaler", "plain_forward", "faults_armed", "optimizer",
        "counter", "data_clock", "optimizer_clock", "batch_iterator", "guard", "held_gradients",
    )

    def __init__(self, module: HFLightningModule) -> None:
        trainer = module.trainer
        # The telemetry's step-side parts (engine/telemetry/), None when it is off: a step then only tests for None.
        telemetry = module.facade._telemetry
        self.counter = None if telemetry is None else telemetry.counter
        self.data_clock = None if telemetry is None else telemetry.data_clock
        self.optimizer_clock = None if telemetry is None else telemetry.optimizer_clock
        self.batch_iterator = _BatchIterator if self.data_clock is None else _TimedBatchIterator
        self.strategy = trainer.strategy
        self.optimizer = module.optimizers()  # the `LightningOptimizer`, set up with the strategy before the fit
        self.root_device = self.strategy.root_device
        # The AMP gradient scaler (fp16 only), set when the precision plugin is built.
        self.scaler = getattr(trainer.precision_plugin, "scaler", None)
        # Whether `_forward_precision_context` is a no-op (full precision, or the strategy owns it): then the
        # window's last micro-batch runs with no context at all.
        forward_is_plain = (
            getattr(self.strategy, "owns_forward_precision", False)
            or planned_autocast_dtype(module.facade.plan.module) is None
        )
        self.plain_forward = (
            forward_is_plain
            and type(module)._forward_precision_context is _BASE_FORWARD_CONTEXT
            and type(module)._sync_context is _BASE_SYNC_CONTEXT
        )
        self.faults_armed = faults_armed()  # the fault-injection tests' step points (checkpoint/fault_points.py)
        run = module._run
        self.guard = None if run is None else run.guard  # the run guard, None when off (engine/run_guard.py)
        # The freed gradients kept for the next backward on CPU, None where that wins nothing (engine/held_gradients.py);
        # off under auto_find_batch_size, whose CPU out-of-memory retries must meet the reference's peak memory.
        facade = module.facade
        self.held_gradients = HeldGradients.for_fit(
            facade.model_wrapped,
            self.root_device,
            self.strategy,
            facade.reuse_gradient_memory and not facade.args.auto_find_batch_size,
        )


_BATCH_TRANSFER_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


def _is_plain_batch_transfer(module: pl.LightningModule) -> bool:
    """Whether moving a batch is Lightning's default `move_data_to_device`: no transfer hook overridden by the
    module, no datamodule (it may define them) and a strategy that keeps the default `batch_to_device`."""
    trainer = module.trainer
    if trainer.datamodule is not None or type(trainer.strategy).batch_to_device is not Strategy.batch_to_device:
        return False
    return all(getattr(type(module), name) is getattr(pl.LightningModule, name) for name in _BATCH_TRANSFER_HOOKS)


# Plain attributes set on every step: Lightning's current-hook name (set and restored around each hook) and
# ours. `nn.Module.__setattr__` would look each one up among parameters, buffers and submodules first; none of
# them is ever one of those, so the lookup can only end in `object.__setattr__`.
_PLAIN_STEP_ATTRIBUTES = frozenset(
    {"_current_fx_name", "_micro_batch_index", "sync_gradients", "end_of_dataloader", "_guard_window"}
)


class HFLightningModule(pl.LightningModule):
    """Wraps the user's model; every step delegates to the facade's overridable methods."""

    def __init__(self, facade: StepHooks, run: ModuleRun | None = None):
        super().__init__()
        self.automatic_optimization = False
        self.model = facade.model
        # Plain attributes (not submodules): the facade and its run are not part of the module tree.
        object.__setattr__(self, "_facade", facade)
        object.__setattr__(self, "_run", run)  # the TrainingRun fitting this module (engine/training_run.py)
        # The accumulation window (the plan's, hf_lightning/translation/handlers/training.py): read here, where the
        # windows are cut, rather than handed over by the run.
        self._ga = facade.plan.module.gradient_accumulation_steps
        self._micro_batch_index = -1
        self._item_count_probe = UnusedItemCountProbe()
        self._plain_transfer: bool | None = None  # decided once the Lightning trainer is attached
        self._update_dispatch = UpdateDispatch()
        self._fit: _FitView | None = None  # looked up at the first step of each fit
        # With a run guard: this window's (epoch, first micro-batch, count) and losses.
        self._guard_window: tuple[tuple[int, int, int], list] | None = None
        # Whether this micro-batch closes the window (accelerate's `sync_gradients`; DeepSpeed reads it).
        self.sync_gradients = True
        # Whether the epoch's last batch has been drawn (accelerate's `gradient_state.end_of_dataloader`: true for
        # every micro-batch of the window that holds it, until the next epoch starts).
        self.end_of_dataloader = False

    # ---- what a strategy built: the strategies hand it over here and write nothing on the facade --------------
    def adopt_wrapped_model(self, wrapped: torch.nn.Module, *, as_model: bool, fsdp: bool = False) -> None:
        """The wrapper a strategy built becomes the facade's `model_wrapped` (with `as_model` also this module's and
        the facade's `model`, the reference's rule for FSDP and tensor parallelism); `fsdp` sets the reference's
        `is_fsdp_enabled`."""
        facade = self.facade
        if as_model:
            self.model = wrapped
            facade.model = wrapped
        facade.model_wrapped = wrapped
        if fsdp:
            facade.is_fsdp_enabled = True

    def adopt_optimizer_and_scheduler(self, optimizer: Any, scheduler: Any) -> None:
        """The optimizer and scheduler a strategy built (DeepSpeed's views; None, None before it builds them)."""
        facade = self.facade
        facade.optimizer = optimizer
        facade.lr_scheduler = scheduler

    def adopt_engine(self, engine: Any) -> None:
        """The DeepSpeed engine around the user's model: the facade's `model_wrapped` and `deepspeed`."""
        facade = self.facade
        facade.model_wrapped = engine
        facade.deepspeed = engine
        facade.is_deepspeed_enabled = True

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _PLAIN_STEP_ATTRIBUTES:
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def _plain_batch_transfer(self) -> bool:
        if self._plain_transfer is None:
            self._plain_transfer = _is_plain_batch_transfer(self)
        return self._plain_transfer

    @property
    def facade(self) -> StepHooks:
        return self._facade

    @property
    def batches_trained_in_epoch(self) -> int:
        """Micro-batches of the current epoch trained on so far (a resumed epoch counts the skipped ones): where a
        checkpoint written now has the train data stand (data/loader_position.py)."""
        return self._micro_batch_index + 1

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def configure_model(self) -> None:
        """FSDP2 shards the user's model here, where Lightning expects it (hf_lightning/strategies/fsdp/policies.py),
        as does tensor parallelism (hf_lightning/strategies/tensor_parallel/strategy.py); else a no-op."""
        shard = getattr(self.trainer.strategy, "shard_user_model", None)
        if shard is not None:
            shard(self)

    # ---- optimizers -------------------------------------------------------------------------
    def configure_optimizers(self):
        """The facade builds the optimizer and scheduler in the reference's order (after the dataloader)."""
        facade = self.facade
        facade.create_optimizer()
        facade.create_scheduler(num_training_steps=facade.state.max_steps)
        # The scheduler is stepped by us after each update, never by Lightning.
        return facade.optimizer

    def on_train_start(self) -> None:
        self._update_dispatch.reset()  # this fit's callbacks, strategy and profiler decide it
        self._fit = None

    def _fit_view(self) -> _FitView:
        if self._fit is None:
            self._fit = _FitView(self)
        return self._fit

    # ---- epochs -----------------------------------------------------------------------------
    def on_train_epoch_start(self) -> None:
        self._micro_batch_index = -1
        self.end_of_dataloader = False
        self.facade._on_epoch_begin(self.current_epoch)
        guard = self._run.guard
        if guard is not None:  # `skip`: a fresh run's state before its first window (engine/guard_snapshot.py)
            guard.at_epoch_start(self.facade, self._run)
        # The resumed epoch continues after the micro-batches already trained on (hf_lightning/checkpoint/resume.py).
        self._micro_batch_index = self._run.resume.enter_epoch(self.current_epoch)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        # A callback asked to end the epoch (or the run) after the previous update: stop before
        # any data of the next window is drawn, as the reference's loop breaks.
        # The epoch also ends after its `num_update_steps_per_epoch` windows: the reference's epoch loop runs
        # exactly that many (a resumed epoch's DataLoader has fewer batches than its `len`).
        control = self.facade.control
        run = self._run
        if (
            control.should_epoch_stop
            or control.should_training_stop
            or run.updates_done_in_epoch >= run.values.num_update_steps_per_epoch
        ):
            return -1
        return None

    def on_train_batch_end(self, *args: Any) -> None:
        # After every callback's `on_train_batch_end` (Lightning calls the module last): the step is logged,
        # evaluated and saved. Fault tests stop the run here (checkpoint/fault_points.py's `reach`), armed before the fit.
        if self._fit_view().faults_armed:
            reach(f"step:{self._facade.state.global_step}")

    def on_train_epoch_end(self) -> None:
        self.release_held_gradients()  # the epoch's end may evaluate and save (engine/held_gradients.py)
        self.facade._on_epoch_end(self.current_epoch, self._micro_batch_index)
        if self.facade.control.should_training_stop:
            self.trainer.should_stop = True

    # ---- one optimizer update ------------------------------------------------------------------
    def training_step(self, dataloader_iter: Iterator) -> None:
        facade = self._facade
        run = self._run
        fit = self._fit_view()
        epoch_iterator = fit.batch_iterator(dataloader_iter, self, fit)
        run.resume.skip_replayed_batches(dataloader_iter)
        if run.skipped_windows and discard_skipped_windows(self, run, dataloader_iter):
            return  # the windows a run guard took out of this path ended the epoch (engine/guard_path.py)
        update_index = run.updates_done_in_epoch
        num_batches = schedule.window_size(
            update_index, run.values.num_update_steps_per_epoch, run.values.steps_in_epoch, self._ga
        )
        batch_samples, num_items_in_batch = facade.get_batch_samples(epoch_iterator, num_batches, self.device)
        if not batch_samples and update_index == 0 and self._micro_batch_index < 0:
            state = facade.state
            raise empty_epoch_error(facade.train_dataset, self.current_epoch, state.global_step, state.max_steps)
        run.resume.sync_rng_after_first_window()
        steps_in_epoch = run.values.steps_in_epoch
        if steps_in_epoch > 0 and self._micro_batch_index + 1 + len(batch_samples) >= steps_in_epoch:
            self.end_of_dataloader = True
        run.updates_done_in_epoch += 1
        facade.current_gradient_accumulation_steps = len(batch_samples)
        model = facade.model_wrapped
        probed_count = self._item_count_probe.arm(facade, num_items_in_batch, len(batch_samples))
        guard = fit.guard
        if guard is not None:
            self._guard_window = ((self.current_epoch, self._micro_batch_index + 1, len(batch_samples)), [])
        last_index = len(batch_samples) - 1
        for index, inputs in enumerate(batch_samples):
            self._micro_batch_index += 1
            step = self._micro_batch_index
            do_sync_step = schedule.is_sync_step(step, run.values.steps_in_epoch, self._ga)
            if step % self._ga == 0:
                facade._fire("on_step_begin")
            self.sync_gradients = do_sync_step
            if index == last_index and fit.plain_forward:
                # Both contexts below would be null ones here: the window's last micro-batch always syncs.
                loss_step = facade.training_step(
                    model, inputs, probed_count if index == 0 else num_items_in_batch
                )
            else:
                with (
                    self._sync_context(is_last_in_window=index == last_index),
                    self._forward_precision_context(),
                ):
                    loss_step = facade.training_step(
                        model, inputs, probed_count if index == 0 else num_items_in_batch
                    )
            if index == 0:
                self._item_count_probe.check(facade.model)
            facade._accumulate_loss(loss_step)
            if guard is not None:
                self._guard_window[1].append(loss_step)
            facade.current_flos += float(facade.floating_point_ops(inputs))
            facade._track_num_input_tokens(inputs)
            if fit.counter is not None:
                fit.counter.count(inputs)
            if do_sync_step:
                self._optimizer_update(step)
            else:
                facade._fire("on_substep_end")
            control = facade.control
            if control.should_epoch_stop or control.should_training_stop:
                break
        if facade.control.should_training_stop:
            self.trainer.should_stop = True

    def _sync_context(self, is_last_in_window: bool):
        """Gradient all-reduce only on the window's last micro-batch (R2.5): `no_sync` of the DDP-wrapped model."""
        if is_last_in_window or self.facade.plan.module.sync_each_batch:
            # sync_each_batch: every micro-batch all-reduces, trading speed for memory (as accelerate's flag).
            return contextlib.nullcontext()
        model = self.facade.model_wrapped
        if getattr(self.trainer.strategy, "owns_gradient_sync", False):  # DeepSpeed: the engine's boundary
            return contextlib.nullcontext()
        if callable(getattr(model, "set_requires_gradient_sync", None)):
            return gradient_sync_disabled(model)  # FSDP2's no_sync
        no_sync = getattr(model, "no_sync", None)
        return no_sync() if callable(no_sync) else contextlib.nullcontext()

    def _forward_precision_context(self):
        """The reference's forward autocast, unless the strategy owns mixed precision (FSDP2, as accelerate)."""
        if getattr(self.trainer.strategy, "owns_forward_precision", False):
            return contextlib.nullcontext()
        return forward_autocast(self.facade.model, self.facade.args, self.facade.plan.module)

    def _optimizer_update(self, micro_batch_index: int) -> None:
        facade = self._facade
        run = self._run
        fit = self._fit_view()
        optimizer = fit.optimizer
        grad_norm = facade._clip_grad_norm(facade.model_wrapped)
        facade._fire("on_pre_optimizer_step")
        scale_before = self._grad_scale()
        clock = fit.optimizer_clock
        if clock is None:
            self._update_dispatch.optimizer_step(self, optimizer)
        else:
            clock.start()
            self._update_dispatch.optimizer_step(self, optimizer)
            clock.stop()
        facade._fire("on_optimizer_step")
        learning_rate = facade._get_learning_rate()
        step_was_skipped = scale_before is not None and self._grad_scale() < scale_before
        if getattr(fit.strategy, "optimizer_step_was_skipped", False):  # DeepSpeed's fp16 overflow
            step_was_skipped = True
        if not step_was_skipped and not facade._scheduler_waits_for_metrics():
            facade.lr_scheduler.step()
        held = fit.held_gradients
        if held is not None:
            held.hold()
        facade.model_wrapped.zero_grad()
        facade.state.global_step += 1
        guard = fit.guard
        if guard is not None:  # judged at the next decision (engine/run_guard.py): no host read here
            window, losses = self._guard_window
            guard.record(facade.state.global_step, losses, grad_norm, window)
        epoch = self.current_epoch  # Lightning's epoch counter moves only between epochs
        facade.state.epoch = schedule.epoch_float(epoch, micro_batch_index, run.values.steps_in_epoch)
        facade._fire("on_step_end")
        run.last_grad_norm, run.last_learning_rate = grad_norm, learning_rate
        facade._maybe_log_save_evaluate(grad_norm, epoch, learning_rate=learning_rate)

    def _grad_scale(self) -> float | None:
        """The AMP loss scale (fp16 only): a drop after `step()` means the scaler skipped the step."""
        scaler = self._fit_view().scaler
        return None if scaler is None else float(scaler.get_scale())

    def backward_loss(self, loss: torch.Tensor) -> None:
        """Backward through Lightning, so precision plugins, strategies and hooks see it (direct when those
        would do nothing: hf_lightning/engine/update_dispatch.py)."""
        self.release_held_gradients()  # this backward reuses their memory (engine/held_gradients.py)
        self._update_dispatch.backward(self, loss)

    def release_held_gradients(self) -> None:
        """The previous update's gradients go now: before an evaluation, a save, a run guard's decision, at an epoch's
        end and when training is over (or failed)."""
        fit = self._fit
        if fit is not None and fit.held_gradients is not None:
            fit.held_gradients.release()


_BASE_FORWARD_CONTEXT = HFLightningModule._forward_precision_context
_BASE_SYNC_CONTEXT = HFLightningModule._sync_context
