"""Convenience setters of ``TrainingArguments`` (R1.11), kept apart from the normalisation code.

Each assigns fields directly and returns ``self``; like the reference, none re-runs ``__post_init__``
or the validation, so derived values are not recomputed.
"""

from __future__ import annotations

import warnings
from typing import TypeVar

from hf_lightning.args.reference_rules import to_enum
from hf_lightning.args.user_warnings import user_stacklevel
from hf_lightning.core.enums import HubStrategy, IntervalStrategy, OptimizerNames, SaveStrategy, SchedulerType

__all__ = ["TrainingArgumentsSetters"]

_Args = TypeVar("_Args", bound="TrainingArgumentsSetters")


class TrainingArgumentsSetters:
    """The reference's ``set_*`` helpers, with its signatures, defaults and quirks."""

    def set_training(
        self: _Args,
        learning_rate: float = 5e-5,
        batch_size: int = 8,
        weight_decay: float = 0,
        num_epochs: float = 3,
        max_steps: int = -1,
        gradient_accumulation_steps: int = 1,
        seed: int = 42,
        activation_checkpointing: bool = False,
        gradient_checkpointing: bool | None = None,
    ) -> _Args:
        """Set ``do_train=True`` and the training fields; the old checkpointing name warns and wins."""
        self.do_train = True
        self.learning_rate = learning_rate
        self.per_device_train_batch_size = batch_size
        self.weight_decay = weight_decay
        self.num_train_epochs = num_epochs
        self.max_steps = max_steps
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.seed = seed
        if gradient_checkpointing is not None:
            warnings.warn(
                "`gradient_checkpointing` is deprecated and will be removed in v6. Use `activation_checkpointing` "
                "instead.",
                FutureWarning,
                stacklevel=user_stacklevel(),
            )
            activation_checkpointing = gradient_checkpointing
        self.activation_checkpointing = self.gradient_checkpointing = activation_checkpointing
        return self

    def set_evaluate(
        self: _Args,
        strategy: str | IntervalStrategy = "no",
        steps: int = 500,
        batch_size: int = 8,
        accumulation_steps: int | None = None,
        delay: float | None = None,
        loss_only: bool = False,
    ) -> _Args:
        """Set the evaluation fields. [quirk, kept] ``delay=None`` stores ``eval_delay=None``."""
        self.eval_strategy = to_enum(IntervalStrategy, strategy, "eval_strategy")
        if self.eval_strategy == IntervalStrategy.STEPS and steps == 0:
            raise ValueError("Setting `strategy` as 'steps' requires a positive value for `steps`.")
        self.do_eval = self.eval_strategy != IntervalStrategy.NO
        self.eval_steps = steps
        self.per_device_eval_batch_size = batch_size
        self.eval_accumulation_steps = accumulation_steps
        self.eval_delay = delay
        self.prediction_loss_only = loss_only
        return self

    def set_testing(self: _Args, batch_size: int = 8, loss_only: bool = False) -> _Args:
        """Set ``do_predict=True`` and the prediction batch size / loss-only flag."""
        self.do_predict = True
        self.per_device_eval_batch_size = batch_size
        self.prediction_loss_only = loss_only
        return self

    def set_save(
        self: _Args,
        strategy: str | IntervalStrategy = "steps",
        steps: int = 500,
        total_limit: int | None = None,
        on_each_node: bool = False,
    ) -> _Args:
        """Set the checkpoint-saving fields."""
        self.save_strategy = to_enum(SaveStrategy, strategy, "save_strategy")
        if self.save_strategy == SaveStrategy.STEPS and steps == 0:
            raise ValueError("Setting `strategy` as 'steps' requires a positive value for `steps`.")
        self.save_steps = steps
        self.save_total_limit = total_limit
        self.save_on_each_node = on_each_node
        return self

    def set_logging(
        self: _Args,
        strategy: str | IntervalStrategy = "steps",
        steps: int = 500,
        report_to: str | list[str] = "none",
        level: str = "passive",
        first_step: bool = False,
        nan_inf_filter: bool = False,
        on_each_node: bool = False,
        replica_level: str = "passive",
    ) -> _Args:
        """Set the logging fields (note the reference's defaults differ from the field defaults)."""
        self.logging_strategy = to_enum(IntervalStrategy, strategy, "logging_strategy")
        if self.logging_strategy == IntervalStrategy.STEPS and steps == 0:
            raise ValueError("Setting `strategy` as 'steps' requires a positive value for `steps`.")
        self.logging_steps = steps
        self.report_to = report_to  # stored as given, as the reference does
        self.log_level = level
        self.logging_first_step = first_step
        self.logging_nan_inf_filter = nan_inf_filter
        self.log_on_each_node = on_each_node
        self.log_level_replica = replica_level
        return self

    def set_push_to_hub(
        self: _Args,
        model_id: str,
        strategy: str | HubStrategy = "every_save",
        token: str | None = None,
        private_repo: bool | None = None,
        always_push: bool = False,
        revision: str | None = None,
    ) -> _Args:
        """Set ``push_to_hub=True`` and the hub fields."""
        self.push_to_hub = True
        self.hub_model_id = model_id
        self.hub_strategy = to_enum(HubStrategy, strategy, "hub_strategy")
        self.hub_token = token
        self.hub_private_repo = private_repo
        self.hub_always_push = always_push
        self.hub_revision = revision
        return self

    def set_optimizer(
        self: _Args,
        name: str | OptimizerNames = "adamw_torch",
        learning_rate: float = 5e-5,
        weight_decay: float = 0,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        args: str | None = None,
    ) -> _Args:
        """Set the optimizer fields (the default name is ``adamw_torch``, as in the reference)."""
        self.optim = to_enum(OptimizerNames, name, "optim")
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.adam_beta1 = beta1
        self.adam_beta2 = beta2
        self.adam_epsilon = epsilon
        self.optim_args = args
        return self

    def set_lr_scheduler(
        self: _Args,
        name: str | SchedulerType = "linear",
        num_epochs: float = 3.0,
        max_steps: int = -1,
        warmup_steps: float = 0,
    ) -> _Args:
        """Set the scheduler type, run length and warmup."""
        self.lr_scheduler_type = to_enum(SchedulerType, name, "lr_scheduler_type")
        self.num_train_epochs = num_epochs
        self.max_steps = max_steps
        self.warmup_steps = warmup_steps
        return self

    def set_dataloader(
        self: _Args,
        train_batch_size: int = 8,
        eval_batch_size: int = 8,
        drop_last: bool = False,
        num_workers: int = 0,
        pin_memory: bool = True,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        multiprocessing_context: str | None = None,
        in_order: bool = True,
        auto_find_batch_size: bool = False,
        ignore_data_skip: bool = False,
        sampler_seed: int | None = None,
    ) -> _Args:
        """Set the batch sizes and dataloader fields (no ``use_cpu`` pin-memory override, as in the reference)."""
        self.per_device_train_batch_size = train_batch_size
        self.per_device_eval_batch_size = eval_batch_size
        self.dataloader_drop_last = drop_last
        self.dataloader_num_workers = num_workers
        self.dataloader_pin_memory = pin_memory
        self.dataloader_persistent_workers = persistent_workers
        self.dataloader_prefetch_factor = prefetch_factor
        self.dataloader_multiprocessing_context = multiprocessing_context
        self.dataloader_in_order = in_order
        self.auto_find_batch_size = auto_find_batch_size
        self.ignore_data_skip = ignore_data_skip
        self.data_seed = sampler_seed
        return self
