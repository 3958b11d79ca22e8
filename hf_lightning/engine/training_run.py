"""One `train()` call: `TrainingRun`, the reference's set-up and finalisation around Lightning's `fit`.

Kept apart from the facade so `trainer.py` holds the overridable API and this module holds the orchestration
(API-1.4: the call order inside `train()`). The run owns the per-run state the reference keeps as private trainer
attributes, and builds its components (the Resumer, the LoggingConnector, the Checkpointer it shares with the
facade) as Lightning's trainer builds its own; the facade holds only `_training_run`, this object while `train()`
runs.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import TYPE_CHECKING, Any, Protocol

import lightning.pytorch as pl
import torch

import hf_lightning.engine.schedule as schedule
from hf_lightning.args.user_warnings import user_stacklevel
from hf_lightning.callbacks import TrainerState
from hf_lightning.checkpoint.global_batch import (
    KEEP_GLOBAL_BATCH_ENV,
    accumulation_keeping_global_batch,
    keep_global_batch_requested,
)
from hf_lightning.checkpoint.restart import checkpoint_after_restart, launcher_restart
from hf_lightning.checkpoint.resume import ResumeHooks, Resumer
from hf_lightning.core.blocked_time import blocked_by
from hf_lightning.core.devices import empty_device_cache, is_out_of_memory
from hf_lightning.core.outputs import TrainOutput
from hf_lightning.core.seeding import seed_from_args
from hf_lightning.engine.guard_path import SkippedWindows
from hf_lightning.engine.interrupt_report import report_interrupt
from hf_lightning.engine.lightning_bridge import build_lightning_trainer, engine_design_warnings_silenced
from hf_lightning.engine.logging_connector import LoggingConnector, LogHooks
from hf_lightning.engine.module import HFLightningModule, StepHooks
from hf_lightning.engine.run_guard import RunGuard, RunGuardStop
from hf_lightning.engine.signals import SignalOwner, SignalScope, keyboard_interrupt_of
from hf_lightning.engine.special_tokens import align_special_tokens
from hf_lightning.engine.telemetry.flops import begin_measuring
from hf_lightning.engine.training_banner import BannerSource, log_training_banner
from hf_lightning.evaluation.helpers import speed_metrics
from hf_lightning.integrations.loggers import publish_run_texts
from hf_lightning.strategies.distributed import ensure_process_group, under_elastic_agent
from hf_lightning.strategies.hung_process import hung_process_error, is_collective_timeout

if TYPE_CHECKING:
    from torch import nn
    from torch.utils.data import DataLoader

    from hf_lightning.engine.memory import TrainerMemoryTracker
    from hf_lightning.translation.plan import ModuleSettings

logger = logging.getLogger(__name__)


class RunFacade(StepHooks, ResumeHooks, LogHooks, SignalOwner, BannerSource, Protocol):
    """The trainer as one `train()` call sees it: what its components see (the module's step hooks, the resume
    hooks, the log, the signals, the banner), and the reference-named set-up and finalisation methods the run
    calls, with the members they move."""

    model_init: Any
    place_model_on_device: bool
    is_model_parallel: bool
    processing_class: Any
    neftune_noise_alpha: float | None
    lightning_callbacks: list[Any]
    lightning_trainer_overrides: dict[str, Any]
    is_in_train: bool
    _memory_tracker: TrainerMemoryTracker
    _model_is_prepared: bool  # a later evaluate() reports no model preparation time
    _trial: Any
    _created_lr_scheduler: bool
    _loggers_before_training: list[Any] | None  # the loggers a run writes to, built before training (or kept)

    def call_model_init(self, trial: Any = None) -> nn.Module: ...
    def get_train_dataloader(self) -> DataLoader: ...
    def set_initial_training_values(self, args: Any, dataloader: DataLoader) -> tuple: ...
    def _stateful_callbacks(self) -> list: ...
    def _hp_search_setup(self, trial: Any) -> None: ...
    def _activate_neftune(self) -> None: ...
    def _deactivate_neftune(self) -> None: ...
    def _data_parallel_layout(self) -> tuple[int, int]: ...
    def _read_changed_arguments(self) -> None: ...
    def _evaluate(
        self, trial: Any, ignore_keys_for_eval: list[str] | None, skip_scheduler: bool = False
    ) -> dict[str, float]: ...
    def _load_best_model(self) -> None: ...
    def _finish_current_push(self) -> None: ...


class TrainingRun:
    """The state and flow of one `train()` call; `auto_find_batch_size` retries are attempts of the same run."""

    def __init__(self, facade: RunFacade, trial: Any = None, ignore_keys_for_eval: list[str] | None = None):
        self.facade = facade
        self.trial = trial
        self.ignore_keys_for_eval = ignore_keys_for_eval
        # Set by each attempt (`_fit_attempt`): the schedule, the step counters and Lightning's objects.
        self.values: schedule.TrainingValues | None = None
        self.start_time = 0.0
        self.updates_done_in_epoch = 0
        self.initial_global_step = 0
        self.initial_num_input_tokens_seen = 0
        # The last update's gradient norm and learning rate: the epoch-end log reports them (R6.3).
        self.last_grad_norm: Any = None
        self.last_learning_rate: float | None = None
        self.module: HFLightningModule | None = None
        self.lightning_trainer: pl.Trainer | None = None
        self.fitting = False  # inside Lightning's `fit`: logs go through Lightning's logger connector
        self.resume = Resumer(facade, self)
        self.logging = LoggingConnector(facade, self)
        self.checkpointing = facade._checkpointer  # the trainer's: its background writer outlives a run
        self.signals = SignalScope(facade)  # SIGTERM / SIGINT during this call (hf_lightning/engine/signals.py)
        # The run guard among the Lightning callbacks (engine/run_guard.py), None when off; the windows it took out
        # of this run's path (also read from a resumed checkpoint, and written into every later one).
        self.guard: RunGuard | None = _run_guard_of(facade.lightning_callbacks, facade.lightning_trainer_overrides)
        self.skipped_windows = SkippedWindows()
        self.rollback_to: str | None = None  # the checkpoint a guard's rollback reloads once the fit has ended
        self.rollback_continuation: Any = None  # `skip`: puts the snapshot's loss window back once the refit starts
        self.guard_halted = False  # a guard decided to roll back or stop: this path logs, evaluates and saves no more
        self.guard_stop: str | None = None  # the guard's stop message, raised once the run is finalised

    def execute(self, resume_from_checkpoint: str | bool | None) -> TrainOutput:
        """The reference's `train()`: model re-init, checkpointing hooks, then the (batch-size retrying) fit."""
        trainer = self.facade
        if resume_from_checkpoint is False:
            resume_from_checkpoint = None
        # memory metrics - must set up as early as possible
        trainer._memory_tracker.start(stage="train")
        args = trainer.args
        trainer.is_in_train = True
        # Training prepares the model: a later evaluate() reports no model preparation time (as the reference).
        trainer._model_is_prepared = True
        # The reference's attribute (its `_hp_search_setup` sets it too): `TrainerState` and the output folder read it.
        trainer._trial = self.trial
        if trainer.model_init is not None:
            seed_from_args(args)
            trainer.model = trainer.call_model_init(self.trial)
            trainer.optimizer, trainer.lr_scheduler = None, None
            if trainer.place_model_on_device:
                trainer.model.to(args.device)
            trainer.model_wrapped = trainer.model
        if (
            (trainer.plan.evaluation.fp16_full_eval or trainer.plan.evaluation.bf16_full_eval)
            and not trainer.is_model_parallel
            and trainer.model_init is None
        ):
            trainer.model.to(args.device)
        _enable_activation_checkpointing(trainer.plan.module, trainer.model)
        align_special_tokens(trainer.model, trainer.processing_class)
        if trainer.neftune_noise_alpha is not None:
            trainer._activate_neftune()
        # The trial's parameters go onto `args` after model_init (which sees the previous trial's args, as the
        # reference's) and may change the seed, batch size and plan used from here on.
        trainer._hp_search_setup(self.trial)
        # A background checkpoint write of an earlier train() is committed before any checkpoint is chosen.
        self.checkpointing.wait_for_pending_write()
        if under_elastic_agent() or launcher_restart() is not None:
            # Under torchrun, the group over this attempt's own store entries (args/process_group.py), before
            # Lightning would make one over the agent's store; after any launcher's restart, the group that carries
            # the first process's choice of checkpoint (checkpoint/restart.py).
            ensure_process_group(args)
        if resume_from_checkpoint is None:  # a launcher's restart continues the run (checkpoint/restart.py)
            resume_from_checkpoint = checkpoint_after_restart(args)
        if args.should_save and self.trial is None:  # before training: another live run in this folder is named
            # (a search trial's run folder is claimed by its first save; `_get_output_dir` is called as often as
            # the reference calls it)
            self.checkpointing.claim_run_dir(args.output_dir)
        try:
            with self.signals:
                # Weights load before the optimizer exists, as the reference's train() does
                # (hf_lightning/checkpoint/resume.py).
                self.resume.prepare(resume_from_checkpoint)
                self._keep_global_batch_if_asked()
                if self.guard is not None:
                    self.guard.begin_train(trainer)
                output = self._with_executable_batch_size()
                while self.rollback_to is not None:  # a guard's rollback: the same run from an earlier checkpoint
                    output = self._rolled_back()
                if self.guard is not None:
                    self.guard.finish(self)
                if self.guard_stop is not None:
                    raise RunGuardStop(self.guard_stop)
                return output
        except KeyboardInterrupt as interrupt:
            # Where to resume from, then the interrupt (uncaught: one line, not a screen of traceback).
            report_interrupt(trainer.args, trainer.state.global_step, "train() interrupted (Ctrl+C)", interrupt)
            raise
        finally:
            self.checkpointing.release_run_dirs()
            if trainer.neftune_noise_alpha is not None and hasattr(trainer, "neftune_hook_handle"):
                trainer._deactivate_neftune()
            trainer.is_in_train = False

    def _keep_global_batch_if_asked(self) -> None:
        """`HF_LIGHTNING_KEEP_GLOBAL_BATCH=1` on a resume with another number of processes: the accumulation that
        keeps the checkpoint's global batch, set on `args` and translated again before training
        (checkpoint/global_batch.py)."""
        if self.resume.files is None or not keep_global_batch_requested():
            return  # nothing is asked of the trainer's methods then (their call counts stay the reference's)
        trainer = self.facade
        accumulation = trainer.plan.module.gradient_accumulation_steps
        per_device = trainer._train_batch_size
        data_parallel = trainer._data_parallel_layout()[0]
        kept = accumulation_keeping_global_batch(self.resume.files.checkpoint, per_device, data_parallel, accumulation)
        if kept is None:
            return
        if trainer.args.process_index == 0:
            logger.warning(
                f"{KEEP_GLOBAL_BATCH_ENV}=1: gradient_accumulation_steps {accumulation} -> {kept}, so that "
                f"{per_device} per device x {data_parallel} data-parallel process(es) x {kept} makes the "
                f"{per_device * data_parallel * kept} samples per update {self.resume.files.checkpoint} was saved with."
            )
        trainer.args.gradient_accumulation_steps = kept
        trainer._read_changed_arguments()

    def _rolled_back(self) -> TrainOutput | None:
        """Continue from the checkpoint a guard's rollback chose (weights, optimizer, scheduler, RNG and data position
        loaded as for `resume_from_checkpoint`), with the offending window left out of the path."""
        checkpoint, self.rollback_to = self.rollback_to, None
        self.guard_halted = False
        control = self.facade.control
        control.should_training_stop = control.should_epoch_stop = False
        control.should_log = control.should_evaluate = control.should_save = False
        # The next fit writes to the same loggers (one run), as a batch-size retry does.
        self.facade._loggers_before_training = list(self.lightning_trainer.loggers)
        self.resume = Resumer(self.facade, self)
        self.resume.prepare(checkpoint)
        return self._with_executable_batch_size()

    def _with_executable_batch_size(self) -> TrainOutput:
        """`auto_find_batch_size`: on an out-of-memory error, retry the whole run at `int(0.9 * batch)`."""
        trainer = self.facade
        if not trainer.args.auto_find_batch_size:
            return self._fit_attempt()
        batch_size = trainer._train_batch_size
        empty_device_cache(collect_garbage=True)
        while True:
            if batch_size == 0:
                raise RuntimeError("No executable batch size found, reached zero.")
            trainer._train_batch_size = batch_size
            previous_lightning_trainer = trainer.lightning_trainer
            try:
                return self._fit_attempt()
            except Exception as error:
                if not is_out_of_memory(error):
                    raise
                if trainer.lightning_trainer is not previous_lightning_trainer:
                    # The next attempt writes to this attempt's loggers (one run), as the reference's callbacks
                    # keep their writers across its retries.
                    trainer._loggers_before_training = list(trainer.lightning_trainer.loggers)
                empty_device_cache(collect_garbage=True)
                batch_size = int(batch_size * 0.9)
                logger.info(f"Out of memory: retrying with a per-process batch of {batch_size}.")

    def _fit_attempt(self) -> TrainOutput:
        """The reference's `_inner_training_loop`: schedule, state, Lightning trainer, `fit`, then the summary."""
        trainer = self.facade
        args = trainer.args
        trainer.model_wrapped = trainer.model
        train_dataloader = trainer.get_train_dataloader()
        values = schedule.TrainingValues(*trainer.set_initial_training_values(args, train_dataloader))
        self.values = values
        self.updates_done_in_epoch = 0
        trainer.state = TrainerState(stateful_callbacks=trainer._stateful_callbacks())
        trainer.state.is_hyper_param_search = self.trial is not None
        trainer.state.train_batch_size = trainer._train_batch_size
        trainer.state.compute_steps(args, values.max_steps)
        self.resume.restore_trainer_state(values, train_dataloader)
        self.skipped_windows.merge(self.resume.skipped_windows())
        trainer.state.init_training_references(trainer, values.max_steps, values.num_train_epochs, self.trial)
        if trainer._created_lr_scheduler:
            trainer.lr_scheduler = None
            trainer._created_lr_scheduler = False

        log_training_banner(trainer, values, self.resume.point)

        _compile_model(trainer)
        module = HFLightningModule(trainer, self)
        self.module = module
        lightning_trainer = build_lightning_trainer(
            trainer.plan,
            values,
            trainer.lightning_callbacks,
            model=trainer.model,
            overrides=trainer.lightning_trainer_overrides,
            loggers=trainer._loggers_before_training,
        )
        trainer._loggers_before_training = None  # they belong to the Lightning trainer from now on
        trainer.lightning_trainer = lightning_trainer
        self.lightning_trainer = lightning_trainer
        self.resume.position_lightning_loops(lightning_trainer)

        self.start_time = time.time()
        self.initial_num_input_tokens_seen = trainer.state.num_input_tokens_seen
        self.initial_global_step = trainer.state.global_step
        self.logging.begin(trainer.state.global_step)
        continuation, self.rollback_continuation = self.rollback_continuation, None
        if continuation is not None:  # a run guard's `skip` goes on as one run (engine/guard_snapshot.py)
            continuation(self)
        self.last_grad_norm = None
        self.last_learning_rate = None
        trainer.model.zero_grad()
        # An evaluate() before train() leaves the model in eval mode; Lightning expects train mode at fit.
        trainer.model.train()

        callback = _TrainBeginBridge(self, train_dataloader)
        lightning_trainer.callbacks.insert(0, callback)
        lightning_trainer.callbacks.insert(0, self.signals.lightning_callback())
        self.fitting = True
        failed = True
        try:
            with engine_design_warnings_silenced():
                try:
                    lightning_trainer.fit(module, train_dataloaders=train_dataloader)
                except SystemExit as exit_:
                    interrupt = keyboard_interrupt_of(exit_)
                    if interrupt is None:
                        raise
                    # Lightning has shut down gracefully and turned Ctrl+C into SystemExit(1); the user's
                    # `except KeyboardInterrupt:` expects the interrupt itself, as from the reference's train().
                    raise interrupt from None
                except RuntimeError as error:
                    if not is_collective_timeout(error):
                        raise
                    # Who did not arrive, asked of the processes that did (strategies/hung_process.py).
                    raise hung_process_error(
                        error, step=trainer.state.global_step, timeout_seconds=trainer.args.ddp_timeout
                    ) from error
            if self.guard is not None and not self.guard_halted:  # the updates since the last decision
                self.guard.decide(trainer, self, at_end=True)
            if not callback.started:
                # Resumed from the final checkpoint: Lightning's loop had nothing to do and skipped on_train_start.
                callback.on_train_start(lightning_trainer, module)
            failed = False
        finally:
            self.fitting = False
            self.release_held_gradients()
            # A background checkpoint write is committed (or its failure raised) before train() goes on.
            with blocked_by(trainer, "checkpoint"):
                self.checkpointing.wait_for_pending_write(raise_failure=not failed)
        if self.rollback_to is not None:
            return None  # not finalised: the run continues from an earlier checkpoint
        self.signals.end_if_requeued()  # SLURM's requeue signal: the checkpoint is complete, the job requeued
        return self._finalize()

    def release_held_gradients(self) -> None:
        """Let the previous update's held gradients go (engine/held_gradients.py) before work that should not run
        beside them: an evaluation, a save, a run guard's decision, the end of the fit."""
        if self.module is not None:
            self.module.release_held_gradients()

    def _finalize(self) -> TrainOutput:
        """The reference's end of training: `train_loss`, speed and memory metrics, best model, `on_train_end`."""
        trainer = self.facade
        num_steps_trained = trainer.state.global_step - self.initial_global_step
        train_loss = self.logging.training_loss(num_steps_trained)
        metrics = speed_metrics(
            "train",
            self.start_time,
            num_samples=self.values.num_train_samples * num_steps_trained / max(trainer.state.max_steps, 1),
            num_steps=num_steps_trained,
        )
        trainer.store_flos()
        metrics["total_flos"] = trainer.state.total_flos
        metrics["train_loss"] = train_loss
        trainer._memory_tracker.stop_and_update_metrics(metrics, stage="train")
        trainer.log(metrics)
        if trainer.plan.checkpointing.load_best_model_at_end and trainer.state.best_model_checkpoint is not None:
            trainer._load_best_model()
        self.checkpointing.rotate_at_train_end(trainer._trial)
        trainer._fire("on_train_end")
        with blocked_by(trainer, "hub"):
            trainer._finish_current_push()  # the background Hub pushes of this run (trainer/hub_methods.py)
        if trainer._telemetry is not None:  # the run's summary: printed (run_performance.json when asked)
            trainer._telemetry.finish_training()
        return TrainOutput(trainer.state.global_step, train_loss, metrics)


def _run_guard_of(lightning_callbacks: list[Any], overrides: dict[str, Any]) -> RunGuard | None:
    """The run guard among the Lightning callbacks: `callbacks=` of the trainer, or a config's `trainer: callbacks:`
    (`lightning_trainer_overrides`)."""
    callbacks = list(lightning_callbacks) + list(overrides.get("callbacks") or [])
    return next((callback for callback in callbacks if isinstance(callback, RunGuard)), None)


def _enable_activation_checkpointing(settings: ModuleSettings, model: nn.Module) -> None:
    """`activation_checkpointing`: the model's own enabling method (the deprecated gradient one warned about)."""
    if not settings.activation_checkpointing:
        return
    kwargs = dict(settings.activation_checkpointing_kwargs or {})
    every_n_layers = kwargs.pop("every_n_layers", 1)
    offload = kwargs.pop("offload", False)
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs=kwargs or None, every_n_layers=every_n_layers, offload=offload
        )
    elif hasattr(model, "gradient_checkpointing_enable"):
        warnings.warn(
            f"`{type(model).__name__}` only defines `gradient_checkpointing_enable`, which is deprecated; "
            "define `activation_checkpointing_enable` instead.",
            FutureWarning,
            stacklevel=user_stacklevel(),
        )
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None)
    else:
        raise ValueError(
            f"activation_checkpointing=True, but {type(model).__name__} has neither "
            "`activation_checkpointing_enable` nor `gradient_checkpointing_enable`. Wrap its blocks with "
            "torch.utils.checkpoint yourself, or set activation_checkpointing=False."
        )


def _compile_model(trainer: RunFacade) -> None:
    """`torch_compile`: the reference runs the compiled module; `trainer.model` stays the original."""
    settings = trainer.plan.module
    if not settings.torch_compile or trainer.model_wrapped is not trainer.model:
        return
    kwargs = {"backend": settings.torch_compile_backend, "mode": settings.torch_compile_mode}
    if settings.torch_compile_backend == "neuron":
        kwargs["dynamic"] = False
    trainer.model_wrapped = torch.compile(trainer.model, **kwargs)


class _TrainBeginBridge(pl.Callback):
    """Fires the reference's `on_train_begin` once Lightning has set up the optimizer and scheduler."""

    def __init__(self, run: TrainingRun, train_dataloader):
        self._run = run
        self._train_dataloader = train_dataloader
        self.started = False

    def on_train_start(self, lightning_trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.started = True
        run = self._run
        facade = run.facade
        run.resume.load_optimizer_and_scheduler()
        handler = facade.callback_handler
        handler.model = facade.model
        handler.optimizer = facade.optimizer
        handler.lr_scheduler = facade.lr_scheduler
        handler.train_dataloader = self._train_dataloader
        for logger in lightning_trainer.loggers:
            # Redacted: `to_sanitized_dict` replaces every *_token value by a placeholder.
            logger.log_hyperparams(facade.args.to_sanitized_dict())
            publish_run_texts(logger, facade.args, facade.model)
        facade._fire("on_train_begin")
        if facade._telemetry is not None:  # measuring starts with the first step (engine/telemetry/)
            begin_measuring(
                facade._telemetry, facade.plan, facade.model, lightning_trainer, time.time() - run.start_time
            )
        if facade.plan.evaluation.on_start:
            facade._evaluate(run.trial, run.ignore_keys_for_eval, skip_scheduler=True)  # before any step
        # Lightning calls every callback on every batch, and this one is done. Rebinding the list (rather than
        # removing from it) leaves the hook loop that is calling us undisturbed.
        lightning_trainer.callbacks = [c for c in lightning_trainer.callbacks if c is not self]
