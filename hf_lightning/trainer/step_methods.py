"""The facade's per-micro-batch and per-update methods: loss, backward, logging, step boundaries.

A mixin of `HFLightningTrainer`. The LightningModule calls these at the reference's call sites, so a
user's override of `training_step`, `compute_loss`, `get_batch_samples` or `log` changes behaviour as it
would under `transformers.Trainer`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

import hf_lightning.data.dataloaders as dataloaders
from hf_lightning.core.devices import empty_device_cache
from hf_lightning.core.enums import enum_value
from hf_lightning.engine.base_methods import is_base_method
from hf_lightning.engine.loss import (
    activate_neftune,
    count_items_in_window,
    deactivate_neftune,
    extract_loss,
    is_causal_lm_class,
)
from hf_lightning.engine.train_mode import ensure_train_mode
from hf_lightning.evaluation.helpers import speed_metrics
from hf_lightning.integrations.loggers import publish_logs, publish_logs_before_training
from hf_lightning.strategies.build import steps_for
from hf_lightning.strategies.steps import StrategySteps

logger = logging.getLogger(__name__)


class TrainingStepMixin:
    """One micro-batch (`training_step`, `compute_loss`), one update's bookkeeping, logging and FLOPs."""

    # ---- one micro-batch -----------------------------------------------------------------------------------
    def get_batch_samples(
        self, epoch_iterator: Iterator, num_batches: int, device: torch.device
    ) -> tuple[list, Any]:
        """Pull up to `num_batches` micro-batches (fewer at exhaustion) and count the window's labels."""
        batch_samples = []
        for _ in range(num_batches):
            try:
                batch_samples.append(next(epoch_iterator))
            except StopIteration:
                break
        return batch_samples, self._get_num_items_in_batch(batch_samples, device)

    def _get_num_items_in_batch(self, batch_samples: list, device: torch.device) -> Any:
        counts = (
            len(batch_samples) > 0
            and "labels" in batch_samples[0]
            and (self.model_accepts_loss_kwargs or self.compute_loss_func is not None)
        )
        num_items_in_batch = (
            count_items_in_window(batch_samples, self._loss_shifts_labels) if counts else None
        )
        if num_items_in_batch is not None and torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(device)
            if self.plan.module.average_tokens_across_devices and self.args.world_size > 1:
                num_items_in_batch = self._all_reduce_sum(num_items_in_batch)
            num_items_in_batch = num_items_in_batch / (
                self.get_tp_size() * self.get_cp_size() * self.get_sp_size()
            )
        return num_items_in_batch

    def _all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            tensor = tensor.clone()
            torch.distributed.all_reduce(tensor)
        return tensor

    def training_step(
        self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None
    ) -> torch.Tensor:
        """Forward, loss, the reference's accumulation scaling and backward (through Lightning) of one micro-batch."""
        ensure_train_mode(model)
        if hasattr(self.optimizer, "train") and callable(self.optimizer.train):
            self.optimizer.train()
        inputs = self._prepare_inputs(inputs)
        if _loss_context_is_empty(self):
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        else:
            with self.compute_loss_context_manager():
                loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        del inputs
        if (
            self.plan.module.torch_empty_cache_steps is not None
            and self.state.global_step % self.plan.module.torch_empty_cache_steps == 0
        ):
            empty_device_cache()
        if self.loss_is_scaled_for_ga is not None:
            loss_is_scaled_for_ga = self.loss_is_scaled_for_ga
        else:
            loss_is_scaled_for_ga = (
                self.model_accepts_loss_kwargs and num_items_in_batch is not None
            ) or self.compute_loss_func is not None
        if not loss_is_scaled_for_ga and self.current_gradient_accumulation_steps != 1:
            # The reference divides by a window of one too; `x / 1` is `x` exactly, and so is its gradient, so
            # that division (and its autograd node) is skipped.
            loss = loss / self.current_gradient_accumulation_steps
        self._training_run.module.backward_loss(loss)
        return loss.detach()

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ):
        """The reference's default loss: model loss, label smoothing or `compute_loss_func` (R4.1)."""
        if (self.label_smoother is not None or self.compute_loss_func is not None) and "labels" in inputs:
            labels = inputs.pop("labels")
        else:
            labels = None
        if self.model_accepts_loss_kwargs and num_items_in_batch is not None:
            inputs = {**inputs, "num_items_in_batch": num_items_in_batch}
        outputs = model(**inputs)
        if self.compute_loss_func is not None:
            if labels is None:
                logger.warning(
                    "Trainer: `compute_loss_func` is defined but `labels=None`. "
                    "Your custom loss function will still be called with labels=None. "
                )
            loss = self.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch)
        elif labels is not None:
            shift = is_causal_lm_class(model)
            loss = self.label_smoother(
                outputs, labels, shift_labels=shift, num_items_in_batch=num_items_in_batch
            )
        else:
            loss = extract_loss(outputs, inputs)
        if (
            self.plan.module.average_tokens_across_devices
            and (self.model_accepts_loss_kwargs or self.compute_loss_func)
            and num_items_in_batch is not None
        ):
            loss *= self.args.world_size // self.get_tp_size()
        return (loss, outputs) if return_outputs else loss

    def compute_loss_context_manager(self) -> contextlib.ExitStack:
        """Wraps every `compute_loss` call; enters `autocast_smart_context_manager()` unless it is a no-op."""
        stack = contextlib.ExitStack()
        autocast_ctx = self.autocast_smart_context_manager()
        if not isinstance(autocast_ctx, contextlib.nullcontext):
            stack.enter_context(autocast_ctx)
        return stack

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True):
        """A no-op: mixed precision is applied by Lightning's precision plugin."""
        return contextlib.nullcontext()

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        """6 x tokens x non-embedding parameters for models with `num_parameters`, else 0 (R6.7)."""
        main_input = getattr(self.model, "main_input_name", "input_ids")
        if main_input in inputs and hasattr(self.model, "num_parameters"):
            return 6 * inputs[main_input].numel() * self.model.num_parameters(exclude_embeddings=True)
        return 0

    def _track_num_input_tokens(self, inputs: dict[str, Any]) -> None:
        mode = self.plan.module.include_num_input_tokens_seen
        if mode == "no":
            return
        main_input_name = getattr(self.model, "main_input_name", "input_ids")
        if main_input_name not in inputs:
            logger.warning(
                "Tried to track the number of tokens seen, however the current model is not configured properly to "
                "know what item is the input. To fix this, add a `main_input_name` attribute to the model class."
            )
            return
        pad_token_id = getattr(self.processing_class, "pad_token_id", None)
        if mode == "non_padding" and "attention_mask" in inputs:
            input_tokens = inputs["attention_mask"].sum()
        elif mode == "non_padding" and pad_token_id is not None:
            input_tokens = (inputs[main_input_name] != pad_token_id).sum()
        else:
            if mode == "non_padding":
                logger.warning("Could not determine method to count non-padding tokens, counting all tokens.")
            input_tokens = inputs[main_input_name].numel()
        input_tokens = torch.as_tensor(input_tokens, device=self.args.device, dtype=torch.int64)
        self.state.num_input_tokens_seen += int(self._all_reduce_sum(input_tokens).item())

    # ---- logging ---------------------------------------------------------------------------------------------
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add epoch (and token counts) to `logs`, append it to `log_history` and fire `on_log`."""
        if self.state.epoch is not None:
            logs["epoch"] = self.state.epoch
        if self.plan.module.include_num_input_tokens_seen != "no":
            logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
            if start_time is not None:
                run = self._training_run
                initial_tokens = run.initial_num_input_tokens_seen if run is not None else 0
                tokens = self.state.num_input_tokens_seen - initial_tokens
                logs.update(speed_metrics("train", start_time, num_tokens=tokens))
        self.state.log_history.append({**logs, "step": self.state.global_step})
        # The reference's trackers run before the printer, which pops `total_flos` from `logs`.
        logger_logs = dict(logs)
        self.control = self.callback_handler.on_log(self.args, self.state, self.control, logs)
        if self.lightning_trainer is not None:
            run = self._training_run
            publish_logs(
                self.lightning_trainer,
                logger_logs,
                self.state.global_step,
                outside_fit=run is None or not run.fitting,
            )
        else:
            publish_logs_before_training(self._current_loggers(), logger_logs, self.state.global_step)

    def store_flos(self) -> None:
        """Move this process's FLOP count into `state.total_flos` (summed over processes)."""
        if self.args.world_size > 1:
            flos = torch.tensor(float(self.current_flos), dtype=torch.float64, device=self.args.device)
            self.state.total_flos += float(self._all_reduce_sum(flos).item())
        else:
            self.state.total_flos += self.current_flos
        self.current_flos = 0

    def _accumulate_loss(self, loss_step: torch.Tensor) -> None:
        """Add a micro-batch loss to the logging window, with the reference's NaN/Inf filter (R6.3), applied
        when the window is read (hf_lightning/engine/loss_window.py): a step never waits for the device."""
        logging_connector = self._training_run.logging
        logging_connector.loss.add(
            loss_step,
            steps_since_log=1 + self.state.global_step - logging_connector.globalstep_last_logged,
            filter_non_finite=self.plan.logging.nan_inf_filter,
        )

    @property
    def _strategy_steps(self) -> StrategySteps:
        """What the planned strategy does at each update and answers the engine (strategies/steps.py)."""
        return steps_for(self.plan)

    def _clip_grad_norm(self, model: nn.Module) -> float:
        """Clip at `max_grad_norm` (or only measure with clipping off) and return the pre-clip norm (R4.8), the
        strategy's way (strategies/steps.py: DeepSpeed's engine clipped inside its step and reports its norm)."""
        max_grad_norm = self.plan.module.max_grad_norm
        clips = max_grad_norm is not None and 0 < max_grad_norm < float("inf")
        scaler = (
            getattr(self.lightning_trainer.precision_plugin, "scaler", None)
            if self.lightning_trainer
            else None
        )
        inv_scale = None if scaler is None else 1.0 / scaler.get_scale()
        return self._strategy_steps.clip_gradients_norm(model, max_grad_norm if clips else None, inv_scale)

    def _maybe_log_save_evaluate(
        self, grad_norm: Any, epoch: int, learning_rate: float | None = None
    ) -> None:
        """Log, then evaluate, then save, as the flow callbacks decided (EVAL-2.17), through the run's components."""
        run = self._training_run
        if run.guard_halted:  # a run guard rolls back or stops: nothing more of this path is logged or saved
            return
        logs_now = self.control.should_log and self.state.global_step > run.logging.globalstep_last_logged
        if logs_now:
            run.logging.log_training_window(grad_norm, learning_rate)
        guard = run.guard
        decided = guard is not None and guard.due(logs_now, self.state, self.args)
        if decided:  # the run guard decides here (engine/run_guard.py)
            run.release_held_gradients()  # its snapshot copies the state: not beside the held gradients
            guard.decide(self, run)
            if run.rollback_to is not None:
                return
        if self.control.should_evaluate:
            metrics = self._evaluate(run.trial, run.ignore_keys_for_eval)
            is_new_best_metric = self._determine_best_metric(metrics=metrics, trial=run.trial)
            if enum_value(self.plan.checkpointing.save_strategy) == "best":
                self.control.should_save = is_new_best_metric
        run.checkpointing.announce_committed_save()  # a background write committed since: its on_save
        if self.control.should_save or run.signals.checkpoint_pending():
            run.release_held_gradients()
            run.checkpointing.save_at_step_boundary(run.trial)  # a SIGTERM checkpoint (enable_jit_checkpoint) whatever the save rule said
        if decided:  # `skip` keeps the state of a boundary whose updates were all accepted
            guard.after_decision(self, run)

    def _gather_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        if (
            self.args.world_size > 1
            and torch.distributed.is_available()
            and torch.distributed.is_initialized()
        ):
            return self._all_reduce_sum(tensor.detach()) / self.args.world_size
        return tensor.detach()

    def _on_epoch_begin(self, epoch: int) -> None:
        run = self._training_run
        run.updates_done_in_epoch = 0
        run.last_grad_norm, run.last_learning_rate = None, None
        self._fire("on_epoch_begin")
        # Before Lightning draws the epoch's first batch: the sampler order of epoch `epoch` (R3.2).
        dataloaders.set_train_epoch(self.callback_handler.train_dataloader, epoch)

    def _on_epoch_end(self, epoch: int, last_micro_batch_index: int) -> None:
        if last_micro_batch_index < 0:
            logger.warning(
                "There seems not to be a single sample in your epoch_iterator, stopping training at step"
                f" {self.state.global_step}! This is expected if you're using an IterableDataset and set"
                f" num_steps ({self.state.max_steps}) higher than the number of available samples."
            )
            self.control.should_training_stop = True
        self._fire("on_epoch_end")
        run = self._training_run
        self._maybe_log_save_evaluate(run.last_grad_norm, epoch, learning_rate=run.last_learning_rate)

    def _activate_neftune(self) -> None:
        self.neftune_hook_handle = activate_neftune(self.model, self.neftune_noise_alpha)

    def _deactivate_neftune(self) -> None:
        deactivate_neftune(self.model, self.neftune_hook_handle)


def _loss_context_is_empty(trainer: TrainingStepMixin) -> bool:
    """Whether `compute_loss_context_manager()` would be an empty `ExitStack`: neither it nor
    `autocast_smart_context_manager` is overridden (on the class or the instance), so entering it does nothing."""
    return is_base_method(trainer.compute_loss_context_manager, _BASE_LOSS_CONTEXT) and is_base_method(
        trainer.autocast_smart_context_manager, _BASE_AUTOCAST_CONTEXT
    )


_BASE_LOSS_CONTEXT = TrainingStepMixin.compute_loss_context_manager
_BASE_AUTOCAST_CONTEXT = TrainingStepMixin.autocast_smart_context_manager
