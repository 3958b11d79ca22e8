"""One `train()` call: the reference's set-up and finalisation around Lightning's `fit`.

Kept apart from the facade so `trainer.py` holds the overridable API and this module holds the
orchestration (API-1.4: the call order inside `train()`).
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch

import hf_lightning.checkpoint.resume as resume
import hf_lightning.engine.schedule as schedule
from hf_lightning.args.user_warnings import user_stacklevel
from hf_lightning.engine.devices import empty_device_cache, is_out_of_memory
from hf_lightning.engine.lightning_bridge import build_lightning_trainer
from hf_lightning.engine.loss_window import TrainLossWindow
from hf_lightning.engine.module import HFLightningModule
from hf_lightning.engine.outputs import TrainOutput
from hf_lightning.engine.protocols import TrainerLike
from hf_lightning.engine.seeding import seed_from_args
from hf_lightning.integrations.logger_adapters import send_run_texts

logger = logging.getLogger(__name__)


@dataclass
class RunBookkeeping:
    """Mutable counters of one `train()` call (the reference keeps them as private trainer attributes)."""

    values: schedule.TrainingValues
    ga: int
    start_time: float
    updates_done_in_epoch: int = 0


def run_training(
    trainer: TrainerLike,
    resume_from_checkpoint: str | bool | None,
    trial: Any,
    ignore_keys_for_eval: list[str] | None,
) -> TrainOutput:
    """The reference's `train()`: model re-init, checkpointing hooks, then the (batch-size retrying) inner loop."""
    from hf_lightning.evaluation.helpers import speed_metrics

    if resume_from_checkpoint is False:
        resume_from_checkpoint = None
    # memory metrics - must set up as early as possible
    trainer._memory_tracker.start(stage="train")
    args = trainer.args
    trainer.is_in_train = True
    # Training prepares the model: a later evaluate() reports no model preparation time (as the reference).
    trainer._model_is_prepared = True
    trainer._trial = trial
    trainer._ignore_keys_for_eval = ignore_keys_for_eval
    if trainer.model_init is not None:
        seed_from_args(args)
        trainer.model = trainer.call_model_init(trial)
        trainer.optimizer, trainer.lr_scheduler = None, None
        if trainer.place_model_on_device:
            trainer.model.to(args.device)
        trainer.model_wrapped = trainer.model
    if (
        (args.fp16_full_eval or args.bf16_full_eval)
        and not trainer.is_model_parallel
        and trainer.model_init is None
    ):
        trainer.model.to(args.device)
    _enable_activation_checkpointing(trainer)
    if trainer.neftune_noise_alpha is not None:
        trainer._activate_neftune()
    # The trial's parameters go onto `args` after model_init (which sees the previous trial's args, as the
    # reference's) and may change the seed, batch size and plan used from here on.
    trainer._hp_search_setup(trial)
    # Weights load before the optimizer exists, as the reference's train() does (hf_lightning/checkpoint/resume.py).
    trainer._resume_files = resume.prepare_resume(trainer, resume_from_checkpoint)
    try:
        return _with_executable_batch_size(trainer, speed_metrics)
    finally:
        if trainer.neftune_noise_alpha is not None and hasattr(trainer, "neftune_hook_handle"):
            trainer._deactivate_neftune()
        trainer.is_in_train = False


def _enable_activation_checkpointing(trainer: TrainerLike) -> None:
    settings = trainer.plan.module
    if not settings.activation_checkpointing:
        return
    kwargs = dict(settings.activation_checkpointing_kwargs or {})
    every_n_layers = kwargs.pop("every_n_layers", 1)
    offload = kwargs.pop("offload", False)
    model = trainer.model
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


def _with_executable_batch_size(trainer: TrainerLike, speed_metrics) -> TrainOutput:
    """`auto_find_batch_size`: on an out-of-memory error, retry the whole run at `int(0.9 * batch)`."""
    if not trainer.args.auto_find_batch_size:
        return _inner_training_loop(trainer, speed_metrics)
    batch_size = trainer._train_batch_size
    empty_device_cache(collect_garbage=True)
    while True:
        if batch_size == 0:
            raise RuntimeError("No executable batch size found, reached zero.")
        trainer._train_batch_size = batch_size
        previous_lightning_trainer = trainer.lightning_trainer
        try:
            return _inner_training_loop(trainer, speed_metrics)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            if trainer.lightning_trainer is not previous_lightning_trainer:
                # The next attempt writes to this attempt's loggers (one run), as the reference's callbacks keep
                # their writers across its retries.
                trainer._loggers_before_training = list(trainer.lightning_trainer.loggers)
            empty_device_cache(collect_garbage=True)
            batch_size = int(batch_size * 0.9)
            logger.info(f"Out of memory: retrying with a per-process batch of {batch_size}.")


def _compile_model(trainer: TrainerLike) -> None:
    """`torch_compile`: the reference runs the compiled module; `trainer.model` stays the original."""
    settings = trainer.plan.module
    if not settings.torch_compile or trainer.model_wrapped is not trainer.model:
        return
    kwargs = {"backend": settings.torch_compile_backend, "mode": settings.torch_compile_mode}
    if settings.torch_compile_backend == "neuron":
        kwargs["dynamic"] = False
    trainer.model_wrapped = torch.compile(trainer.model, **kwargs)


def _inner_training_loop(trainer: TrainerLike, speed_metrics) -> TrainOutput:
    from hf_lightning.callbacks import TrainerState

    args = trainer.args
    trainer.model_wrapped = trainer.model
    train_dataloader = trainer.get_train_dataloader()
    values = schedule.TrainingValues(*trainer.set_initial_training_values(args, train_dataloader))
    trainer.state = TrainerState(stateful_callbacks=trainer._stateful_callbacks())
    trainer.state.is_hyper_param_search = trainer._trial is not None
    trainer.state.train_batch_size = trainer._train_batch_size
    trainer.state.compute_steps(args, values.max_steps)
    trainer._resume = resume.restore_trainer_state(trainer, values)
    trainer.state.init_training_references(trainer, values.max_steps, values.num_train_epochs, trainer._trial)
    if trainer._created_lr_scheduler:
        trainer.lr_scheduler = None
        trainer._created_lr_scheduler = False

    logger.info("***** Running training *****")
    logger.info(f"  Num examples = {values.num_examples:,}")
    logger.info(f"  Num Epochs = {values.num_train_epochs:,}")
    logger.info(f"  Total optimization steps = {values.max_steps:,}")

    _compile_model(trainer)
    module = HFLightningModule(trainer)
    trainer._lightning_module = module
    lightning_trainer = build_lightning_trainer(
        trainer.plan,
        values,
        trainer.lightning_callbacks,
        model=trainer.model,
        overrides=trainer.lightning_trainer_overrides,
        loggers=getattr(trainer, "_loggers_before_training", None),
    )
    trainer._loggers_before_training = None  # they belong to the Lightning trainer from now on
    trainer.lightning_trainer = lightning_trainer
    resume.position_lightning_loops(trainer, lightning_trainer)

    start_time = time.time()
    trainer._run = RunBookkeeping(
        values=values, ga=trainer.plan.module.gradient_accumulation_steps, start_time=start_time
    )
    trainer._initial_num_input_tokens_seen = trainer.state.num_input_tokens_seen
    trainer._initial_global_step = trainer.state.global_step
    trainer._tr_loss = TrainLossWindow(args.device)
    trainer._total_loss_scalar = 0.0
    trainer._globalstep_last_logged = trainer.state.global_step
    trainer._last_grad_norm = None
    trainer._last_learning_rate = None
    trainer.model.zero_grad()
    # An evaluate() before train() leaves the model in eval mode; Lightning expects train mode at fit.
    trainer.model.train()

    callback = _TrainBeginBridge(trainer, train_dataloader)
    lightning_trainer.callbacks.insert(0, callback)
    trainer._fitting = True
    try:
        lightning_trainer.fit(module, train_dataloaders=train_dataloader)
        if not callback.started:
            # Resumed from the final checkpoint: Lightning's loop had nothing to do and skipped on_train_start.
            callback.on_train_start(lightning_trainer, module)
    finally:
        trainer._fitting = False
    return _finalize_training(trainer, values, start_time, speed_metrics)


class _TrainBeginBridge(pl.Callback):
    """Fires the reference's `on_train_begin` once Lightning has set up the optimizer and scheduler."""

    def __init__(self, trainer: TrainerLike, train_dataloader):
        self._trainer = trainer
        self._train_dataloader = train_dataloader
        self.started = False

    def on_train_start(self, lightning_trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.started = True
        facade = self._trainer
        resume.load_optimizer_and_scheduler(facade, lightning_trainer)
        handler = facade.callback_handler
        handler.model = facade.model
        handler.optimizer = facade.optimizer
        handler.lr_scheduler = facade.lr_scheduler
        handler.train_dataloader = self._train_dataloader
        for logger in lightning_trainer.loggers:
            # Redacted: `to_sanitized_dict` replaces every *_token value by a placeholder.
            logger.log_hyperparams(facade.args.to_sanitized_dict())
            send_run_texts(logger, facade.args, facade.model)
        facade._fire("on_train_begin")
        if facade.args.eval_on_start:
            facade._evaluate(facade._trial, facade._ignore_keys_for_eval, skip_scheduler=True)
        # Lightning calls every callback on every batch, and this one is done. Rebinding the list (rather than
        # removing from it) leaves the hook loop that is calling us undisturbed.
        lightning_trainer.callbacks = [c for c in lightning_trainer.callbacks if c is not self]


def _finalize_training(trainer: TrainerLike, values, start_time: float, speed_metrics) -> TrainOutput:
    trainer._total_loss_scalar += trainer._tr_loss.settle().item()
    num_steps_trained = trainer.state.global_step - trainer._initial_global_step
    train_loss = trainer._total_loss_scalar / max(num_steps_trained, 0.001)
    metrics = speed_metrics(
        "train",
        start_time,
        num_samples=values.num_train_samples * num_steps_trained / max(trainer.state.max_steps, 1),
        num_steps=num_steps_trained,
    )
    trainer.store_flos()
    metrics["total_flos"] = trainer.state.total_flos
    metrics["train_loss"] = train_loss
    trainer._memory_tracker.stop_and_update_metrics(metrics, stage="train")
    trainer.log(metrics)
    if trainer.args.load_best_model_at_end and trainer.state.best_model_checkpoint is not None:
        trainer._load_best_model()
    trainer._after_training_rotation()
    trainer._fire("on_train_end")
    return TrainOutput(trainer.state.global_step, train_loss, metrics)
