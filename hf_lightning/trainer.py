"""`HFLightningTrainer`: the facade users hold, with the reference Trainer's constructor and methods.

It owns the model, data, `TrainerState` and HF callbacks; `train()` builds a `lightning.Trainer` from the
translation plan and runs `fit` on an `HFLightningModule`, which calls back into the overridable methods
here (`get_batch_samples`, `training_step`, `compute_loss`, `create_optimizer`, `create_scheduler`, `log`).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from hf_lightning import data as data_layer
from hf_lightning import optim as optim_layer
from hf_lightning import schedule
from hf_lightning.args import TrainingArguments, as_training_arguments
from hf_lightning.callbacks import (
    CallbackHandler,
    DefaultFlowCallback,
    PrinterCallback,
    ProgressCallback,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    is_exportable_state,
)
from hf_lightning.checkpoint import CheckpointMixin
from hf_lightning.collate import pick_default_collator
from hf_lightning.eval_utils import has_length, speed_metrics
from hf_lightning.evaluation import EvaluationMixin
from hf_lightning.loss import (
    LabelSmoother,
    activate_neftune,
    count_items_in_window,
    deactivate_neftune,
    extract_loss,
    is_causal_lm_class,
    loss_shifts_labels,
    unwrap_peft,
)
from hf_lightning.outputs import TrainOutput
from hf_lightning.schedulers import get_scheduler
from hf_lightning.seeding import seed_from_args

logger = logging.getLogger(__name__)

_PLATEAU_SCHEDULER_NAMES = ("ReduceLROnPlateau", "GreedyLR")


@dataclass
class _RunBookkeeping:
    """Mutable counters of one `train()` call (the reference keeps them as private trainer attributes)."""

    values: schedule.TrainingValues
    ga: int
    start_time: float
    updates_done_in_epoch: int = 0


class HFLightningTrainer(EvaluationMixin, CheckpointMixin):
    """Drop-in for `transformers.Trainer` whose training loop is Lightning's."""

    # None: decide per step as the reference does (R4.5); a subclass sets True/False for its own loss.
    loss_is_scaled_for_ga: bool | None = None

    def __init__(
        self,
        model: nn.Module | None = None,
        args: TrainingArguments | None = None,
        data_collator: Callable | None = None,
        train_dataset: Dataset | None = None,
        eval_dataset: Dataset | dict[str, Dataset] | None = None,
        processing_class: Any = None,
        model_init: Callable[..., nn.Module] | None = None,
        compute_loss_func: Callable | None = None,
        compute_metrics: Callable | None = None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers: tuple[torch.optim.Optimizer | None, Any] = (None, None),
        optimizer_cls_and_kwargs: tuple[type[torch.optim.Optimizer], dict[str, Any]] | None = None,
        preprocess_logits_for_metrics: Callable | None = None,
        **deprecated_kwargs: Any,
    ):
        processing_class = _fold_tokenizer_alias(processing_class, deprecated_kwargs)
        if args is None:
            args = TrainingArguments(output_dir="tmp_trainer")
        self.args = as_training_arguments(args)
        args = self.args
        seed_from_args(args)
        self.lightning_trainer = None
        self.model = model
        self._set_process_log_level()

        if model is None:
            if model_init is None:
                raise RuntimeError("`Trainer` requires either a `model` or `model_init` argument")
            self.model_init = model_init
            model = self.call_model_init()
        else:
            if model_init is not None:
                raise ValueError(
                    "`Trainer` requires either a `model` or `model_init` argument, but not both."
                )
            self.model_init = model_init

        self.is_model_parallel = _is_model_parallel(model)
        self.is_deepspeed_enabled = False
        self.is_fsdp_enabled = False
        if args.place_model_on_device is not None:
            self.place_model_on_device = args.place_model_on_device
        else:
            self.place_model_on_device = not (
                self.is_model_parallel or args.fp16_full_eval or args.bf16_full_eval
            )
        if self.place_model_on_device:
            model.to(args.device)
        self.model_wrapped = model
        self.model = model

        base_model = unwrap_peft(model)
        self.model_accepts_loss_kwargs = data_layer.model_accepts_loss_kwargs(base_model)
        default_label_names = data_layer.infer_label_names(base_model)
        self.label_names = default_label_names if args.label_names is None else args.label_names
        self.can_return_loss = data_layer.can_return_loss(base_model)
        self._loss_shifts_labels = loss_shifts_labels(base_model)
        self.label_smoother = self._build_label_smoother()

        self.data_collator = (
            data_collator if data_collator is not None else pick_default_collator(processing_class)
        )
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        self.processing_class = processing_class
        self.neftune_noise_alpha = args.neftune_noise_alpha
        self.compute_loss_func = compute_loss_func
        self.compute_metrics = compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.optimizer, self.lr_scheduler = optimizers
        self.optimizer_cls_and_kwargs = optimizer_cls_and_kwargs
        self._validate_constructor()

        from hf_lightning.translate import translate

        # Refusals of unsupported fields surface here, before any training starts.
        self.plan = translate(args)

        hf_callbacks, self.lightning_callbacks = _split_callbacks(callbacks)
        self.callback_handler = CallbackHandler(
            [DefaultFlowCallback] + hf_callbacks,
            self.model,
            self.processing_class,
            self.optimizer,
            self.lr_scheduler,
        )
        self.add_callback(PrinterCallback if args.disable_tqdm else ProgressCallback)

        self.hub_model_id = None
        if args.should_save:
            os.makedirs(args.output_dir, exist_ok=True)

        self.control = TrainerControl()
        self.state = TrainerState(
            is_local_process_zero=self.is_local_process_zero(),
            is_world_process_zero=self.is_world_process_zero(),
            stateful_callbacks=self._stateful_callbacks(),
        )
        self.is_in_train = False
        self.hp_name = None
        self.hp_search_backend = None
        self.current_flos = 0
        self._signature_columns = None
        self._train_batch_size = args.train_batch_size
        self._created_lr_scheduler = False
        self._run: _RunBookkeeping | None = None
        self.control = self.callback_handler.on_init_end(self.args, self.state, self.control)
        if getattr(self.model, "config", None) is not None:
            self.model.config.use_cache = args.use_cache

    def explain(self) -> str:
        """How each argument is translated onto Lightning, one line per field (honoured / refused / ...)."""
        from hf_lightning.translate import explain

        return explain(self.plan)

    # ---- construction helpers ---------------------------------------------------------------
    def _set_process_log_level(self) -> None:
        transformers_logging = _transformers_logging()
        if transformers_logging is not None:
            transformers_logging.set_verbosity(self.args.get_process_log_level())

    def _build_label_smoother(self) -> LabelSmoother | None:
        if self.args.label_smoothing_factor == 0:
            return None
        if getattr(getattr(self.model, "config", None), "problem_type", None) == "multi_label_classification":
            warnings.warn(
                "Label smoothing is not compatible with multi-label classification. "
                "Disabling label smoothing for this training run.",
                UserWarning,
                stacklevel=3,
            )
            return None
        return LabelSmoother(epsilon=self.args.label_smoothing_factor)

    def _validate_constructor(self) -> None:
        """The reference's constructor errors (spec part 2, 1.1.4), same exception types."""
        args = self.args
        if self.model_init is not None and (self.optimizer is not None or self.lr_scheduler is not None):
            raise RuntimeError(
                "Passing a `model_init` is incompatible with providing the `optimizers` argument. "
                "You should subclass `Trainer` and override the `create_optimizer_and_scheduler` method."
            )
        if self.optimizer_cls_and_kwargs is not None and self.optimizer is not None:
            raise RuntimeError(
                "Passing both `optimizers` and `optimizer_cls_and_kwargs` arguments is incompatible."
            )
        if _value(args.eval_strategy) != "no" and self.eval_dataset is None:
            raise ValueError(
                f"You have set `args.eval_strategy` to {_value(args.eval_strategy)} but you didn't pass an "
                "`eval_dataset` to `Trainer`. Either set `args.eval_strategy` to `no` or pass an `eval_dataset`."
            )
        if (
            _value(args.save_strategy) == "best" or args.load_best_model_at_end
        ) and args.metric_for_best_model is None:
            raise ValueError(
                "`args.metric_for_best_model` must be provided when using 'best' save_strategy or if "
                "`args.load_best_model_at_end` is set to `True`."
            )
        if args.batch_eval_metrics and self.compute_metrics is not None:
            if "compute_result" not in inspect.signature(self.compute_metrics).parameters:
                raise ValueError(
                    "When using `batch_eval_metrics`, your `compute_metrics` function must take a `compute_result`"
                    " boolean argument which will be triggered after the last batch of the eval set to signal "
                    "that the summary statistics should be returned by the function."
                )
        if self.train_dataset is not None and not has_length(self.train_dataset) and args.max_steps <= 0:
            raise ValueError(
                "The train_dataset does not implement __len__, max_steps has to be specified. "
                "The number of steps needs to be known in advance for the learning rate scheduler."
            )
        if (
            self.data_collator is not None
            and not callable(self.data_collator)
            and callable(getattr(self.data_collator, "collate_batch", None))
        ):
            raise TypeError(
                "The `data_collator` should be a simple callable (function, class with `__call__`)."
            )

    def _stateful_callbacks(self) -> list:
        return [cb for cb in self.callback_handler.callbacks + [self.control] if is_exportable_state(cb)]

    # ---- callbacks ------------------------------------------------------------------------------
    def add_callback(self, callback: type[TrainerCallback] | TrainerCallback) -> None:
        """Add a callback (a class is instantiated with no arguments)."""
        self.callback_handler.add_callback(callback)

    def pop_callback(self, callback: type[TrainerCallback] | TrainerCallback) -> TrainerCallback | None:
        """Remove a callback and return it (None when absent)."""
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback: type[TrainerCallback] | TrainerCallback) -> None:
        """Remove a callback (an absent instance raises ValueError, as in the reference)."""
        self.callback_handler.remove_callback(callback)

    def _fire(self, event: str) -> None:
        self.control = getattr(self.callback_handler, event)(self.args, self.state, self.control)

    # ---- processes --------------------------------------------------------------------------------
    def is_local_process_zero(self) -> bool:
        """Whether this process is the main one of its node."""
        return self.args.local_process_index == 0

    def is_world_process_zero(self) -> bool:
        """Whether this process is the global main process."""
        return self.args.process_index == 0

    def call_model_init(self, trial: Any = None) -> nn.Module:
        """Call `model_init` with the trial when it takes one argument (the reference's rule)."""
        model_init_argcount = len(inspect.signature(self.model_init).parameters)
        if model_init_argcount == 0:
            model = self.model_init()
        elif model_init_argcount == 1:
            model = self.model_init(trial)
        else:
            raise RuntimeError("model_init should have 0 or 1 argument.")
        if model is None:
            raise RuntimeError("model_init should not return None.")
        return model

    # ---- data -------------------------------------------------------------------------------------
    def get_train_dataloader(self) -> DataLoader:
        """The train DataLoader with the reference's sampler, collation and column removal."""
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        return data_layer.build_train_dataloader(
            self.train_dataset,
            args=self.args,
            data_collator=self.data_collator,
            model=self.model,
            processing_class=self.processing_class,
            world_size=self.args.world_size,
            process_index=self.args.process_index,
            batch_size=self._train_batch_size,
        )

    def get_eval_dataloader(self, eval_dataset: str | Dataset | None = None) -> DataLoader:
        """The eval DataLoader; a string selects one of a dict of eval datasets."""
        if eval_dataset is None and self.eval_dataset is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        dataloader_key = eval_dataset if isinstance(eval_dataset, str) else "eval"
        cache = getattr(self, "_eval_dataloaders", {})
        if dataloader_key in cache and self.args.dataloader_persistent_workers:
            return cache[dataloader_key]
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]
        elif eval_dataset is None:
            eval_dataset = self.eval_dataset
        dataloader = data_layer.build_eval_dataloader(
            eval_dataset,
            args=self.args,
            data_collator=self.data_collator,
            model=self.model,
            processing_class=self.processing_class,
        )
        if self.args.dataloader_persistent_workers:
            self._eval_dataloaders = {**cache, dataloader_key: dataloader}
        return dataloader

    def get_test_dataloader(self, test_dataset: Dataset) -> DataLoader:
        """The test DataLoader (never cached)."""
        return data_layer.build_eval_dataloader(
            test_dataset,
            args=self.args,
            data_collator=self.data_collator,
            model=self.model,
            processing_class=self.processing_class,
            description="test",
        )

    def num_examples(self, dataloader: DataLoader) -> int:
        """Samples in a dataloader's dataset, estimated from its length when the dataset has none."""
        return data_layer.num_examples(dataloader, self.args.per_device_train_batch_size)

    def _prepare_input(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            return type(data)({k: self._prepare_input(v) for k, v in data.items()})
        if isinstance(data, (tuple, list)):
            return type(data)(self._prepare_input(v) for v in data)
        if isinstance(data, torch.Tensor):
            return data.to(device=self.args.device)
        return data

    def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        inputs = self._prepare_input(inputs)
        if len(inputs) == 0:
            raise ValueError(
                "The batch received was empty, your model won't be able to train on it. Double-check that your "
                f"training dataset contains keys expected by the model: {','.join(self._signature_columns or [])}."
            )
        return inputs

    # ---- optimizer and scheduler ---------------------------------------------------------------------
    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        """Parameter names that get weight decay (not LayerNorm, bias or norm-named ones)."""
        return optim_layer.get_decay_parameter_names(model)

    @staticmethod
    def get_optimizer_cls_and_kwargs(
        args: TrainingArguments, model: nn.Module | None = None
    ) -> tuple[Any, Any]:
        """Optimizer class and keyword arguments for `args.optim` (R5.1)."""
        return optim_layer.get_optimizer_cls_and_kwargs(args, model)

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        """Build the optimizer with decay / no-decay groups unless one was given (R5.1, R5.2)."""
        opt_model = self.model if model is None else model
        if self.optimizer is None:
            decay_parameters = self.get_decay_parameter_names(opt_model)
            grouped = [
                {
                    "params": [
                        p
                        for n, p in opt_model.named_parameters()
                        if n in decay_parameters and p.requires_grad
                    ],
                    "weight_decay": self.args.weight_decay,
                },
                {
                    "params": [
                        p
                        for n, p in opt_model.named_parameters()
                        if n not in decay_parameters and p.requires_grad
                    ],
                    "weight_decay": 0.0,
                },
            ]
            if self.optimizer_cls_and_kwargs is not None:
                optimizer_cls, optimizer_kwargs = self.optimizer_cls_and_kwargs
            else:
                optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
            self.optimizer = optim_layer.instantiate_optimizer(
                optimizer_cls, optimizer_kwargs, grouped, opt_model
            )
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        """Build `args.lr_scheduler_type` with the resolved warmup, unless a scheduler was given (R5.4, R5.5)."""
        if self.lr_scheduler is None:
            self.lr_scheduler = get_scheduler(
                self.args.lr_scheduler_type,
                optimizer=self.optimizer if optimizer is None else optimizer,
                num_warmup_steps=self.args.get_warmup_steps(num_training_steps),
                num_training_steps=num_training_steps,
                scheduler_specific_kwargs=self.args.lr_scheduler_kwargs,
            )
            self._created_lr_scheduler = True
        return self.lr_scheduler

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        """Create both; like the reference, `train()` does not call this method."""
        self.create_optimizer()
        self.create_scheduler(num_training_steps=num_training_steps)

    def get_learning_rates(self) -> list[float]:
        """The learning rate of each parameter group."""
        if self.optimizer is None:
            raise ValueError(
                "Trainer optimizer is None, please make sure you have setup the optimizer before."
            )
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_optimizer_group(self, param: str | torch.nn.parameter.Parameter | None = None):
        """The parameter group holding `param` (matched by identity), or every group's parameters."""
        if self.optimizer is None:
            raise ValueError(
                "Trainer optimizer is None, please make sure you have setup the optimizer before."
            )
        if param is not None:
            for group in self.optimizer.param_groups:
                if any(p is param for p in group["params"]):
                    return group
        return [group["params"] for group in self.optimizer.param_groups]

    def get_num_trainable_parameters(self) -> int:
        """Number of parameters that require gradients."""
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def _scheduler_waits_for_metrics(self) -> bool:
        return type(self.lr_scheduler).__name__ in _PLATEAU_SCHEDULER_NAMES

    def _get_learning_rate(self) -> float:
        if self._scheduler_waits_for_metrics():
            last_lr = self.optimizer.param_groups[0]["lr"]
        else:
            last_lr = self.lr_scheduler.get_last_lr()[0]
        return last_lr.item() if torch.is_tensor(last_lr) else last_lr

    # ---- batch sizes ------------------------------------------------------------------------------------
    def get_total_train_batch_size(self, args: TrainingArguments) -> int:
        """Micro-batch x accumulation x data-parallel world size (R2.7)."""
        dp_world_size = args.world_size // (self.get_tp_size() * self.get_cp_size() * self.get_sp_size())
        return self._train_batch_size * args.gradient_accumulation_steps * dp_world_size

    def get_tp_size(self) -> int:
        """Tensor-parallel size (1: parallelism_config is refused by the translation)."""
        return 1

    def get_cp_size(self) -> int:
        """Context-parallel size (1)."""
        return 1

    def get_sp_size(self) -> int:
        """Sequence-parallel size (1)."""
        return 1

    def set_initial_training_values(self, args: TrainingArguments, dataloader: DataLoader) -> tuple:
        """The reference's 7-tuple: epochs, updates per epoch, examples, samples, total batch, steps/epoch, max_steps."""
        len_dataloader = len(dataloader) if has_length(dataloader) else None
        return schedule.initial_training_values(
            max_steps_arg=args.max_steps,
            num_train_epochs_arg=args.num_train_epochs,
            gradient_accumulation_steps=args.gradient_accumulation_steps,
            len_dataloader=len_dataloader,
            num_examples_in_loader=self.num_examples(dataloader) if len_dataloader else None,
            total_train_batch_size=self.get_total_train_batch_size(args),
        ).as_tuple()

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
            if self.args.average_tokens_across_devices and self.args.world_size > 1:
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
        model.train()
        if hasattr(self.optimizer, "train") and callable(self.optimizer.train):
            self.optimizer.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        del inputs
        if (
            self.args.torch_empty_cache_steps is not None
            and self.state.global_step % self.args.torch_empty_cache_steps == 0
        ):
            _clear_device_cache()
        if self.loss_is_scaled_for_ga is not None:
            loss_is_scaled_for_ga = self.loss_is_scaled_for_ga
        else:
            loss_is_scaled_for_ga = (
                self.model_accepts_loss_kwargs and num_items_in_batch is not None
            ) or self.compute_loss_func is not None
        if not loss_is_scaled_for_ga:
            loss = loss / self.current_gradient_accumulation_steps
        self._lightning_module.backward_loss(loss)
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
            self.args.average_tokens_across_devices
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
        mode = self.args.include_num_input_tokens_seen
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
        if self.args.include_num_input_tokens_seen != "no":
            logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
            if start_time is not None:
                tokens = self.state.num_input_tokens_seen - self._initial_num_input_tokens_seen
                logs.update(speed_metrics("train", start_time, num_tokens=tokens))
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.callback_handler.on_log(self.args, self.state, self.control, logs)

    def store_flos(self) -> None:
        """Move this process's FLOP count into `state.total_flos` (summed over processes)."""
        if self.args.world_size > 1:
            flos = torch.tensor(float(self.current_flos), dtype=torch.float64, device=self.args.device)
            self.state.total_flos += float(self._all_reduce_sum(flos).item())
        else:
            self.state.total_flos += self.current_flos
        self.current_flos = 0

    # ---- training ---------------------------------------------------------------------------------------------
    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
    ) -> TrainOutput:
        """Train with Lightning's loop, reproducing the reference's steps, logs and metrics."""
        from hf_lightning.training_run import run_training

        return run_training(self, resume_from_checkpoint, trial, ignore_keys_for_eval)

    def _accumulate_loss(self, loss_step: torch.Tensor) -> None:
        """Add a micro-batch loss to the logging window, with the reference's NaN/Inf filter (R6.3)."""
        if self.args.logging_nan_inf_filter and not torch.isfinite(loss_step).all():
            self._tr_loss += self._tr_loss / (1 + self.state.global_step - self._globalstep_last_logged)
        else:
            self._tr_loss += loss_step

    def _clip_grad_norm(self, model: nn.Module) -> float:
        """Clip at `max_grad_norm` (or only measure with clipping off) and return the pre-clip norm (R4.8)."""
        max_norm = self.args.max_grad_norm if self.args.max_grad_norm > 0 else float("inf")
        parameters = [p for p in model.parameters() if p.grad is not None]
        scaler = (
            getattr(self.lightning_trainer.precision_plugin, "scaler", None)
            if self.lightning_trainer
            else None
        )
        if scaler is not None:
            # Lightning unscales inside `optimizer.step()`; measure on unscaled values and clip the scaled
            # gradients by the same factor, which is what unscale-then-clip does.
            inv_scale = 1.0 / scaler.get_scale()
            norm = torch.nn.utils.get_total_norm([p.grad for p in parameters]) * inv_scale
            if max_norm != float("inf"):
                torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
            return norm
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)

    def _maybe_log_save_evaluate(
        self, grad_norm: Any, epoch: int, learning_rate: float | None = None
    ) -> None:
        """Log, then evaluate, then save, as the flow callbacks decided (spec part 2, 2.17)."""
        if self.control.should_log and self.state.global_step > self._globalstep_last_logged:
            logs: dict[str, float] = {}
            tr_loss_scalar = self._gather_mean(self._tr_loss).item()
            self._tr_loss -= self._tr_loss
            logs["loss"] = tr_loss_scalar / (self.state.global_step - self._globalstep_last_logged)
            if grad_norm is not None:
                logs["grad_norm"] = grad_norm.item() if isinstance(grad_norm, torch.Tensor) else grad_norm
            logs["learning_rate"] = learning_rate if learning_rate is not None else self._get_learning_rate()
            self._total_loss_scalar += tr_loss_scalar
            self._globalstep_last_logged = self.state.global_step
            self.store_flos()
            self.log(logs, self._run.start_time)
        if self.control.should_evaluate:
            metrics = self._evaluate(self._trial, self._ignore_keys_for_eval)
            is_new_best_metric = self._determine_best_metric(metrics=metrics, trial=self._trial)
            if _value(self.args.save_strategy) == "best":
                self.control.should_save = is_new_best_metric
        if self.control.should_save:
            self._save_checkpoint(self.model, self._trial)
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def _gather_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        if (
            self.args.world_size > 1
            and torch.distributed.is_available()
            and torch.distributed.is_initialized()
        ):
            return self._all_reduce_sum(tensor.detach()) / self.args.world_size
        return tensor.detach()

    def _on_epoch_begin(self, epoch: int) -> None:
        self._run.updates_done_in_epoch = 0
        self._last_grad_norm, self._last_learning_rate = None, None
        self._fire("on_epoch_begin")
        # Before Lightning draws the epoch's first batch: the sampler order of epoch `epoch` (R3.2).
        data_layer.set_train_epoch(self.callback_handler.train_dataloader, epoch)

    def _on_epoch_end(self, epoch: int, last_micro_batch_index: int) -> None:
        if last_micro_batch_index < 0:
            logger.warning(
                "There seems not to be a single sample in your epoch_iterator, stopping training at step"
                f" {self.state.global_step}! This is expected if you're using an IterableDataset and set"
                f" num_steps ({self.state.max_steps}) higher than the number of available samples."
            )
            self.control.should_training_stop = True
        self._fire("on_epoch_end")
        self._maybe_log_save_evaluate(self._last_grad_norm, epoch, learning_rate=self._last_learning_rate)

    def _activate_neftune(self) -> None:
        self.neftune_hook_handle = activate_neftune(self.model, self.neftune_noise_alpha)

    def _deactivate_neftune(self) -> None:
        deactivate_neftune(self.model, self.neftune_hook_handle)


def _split_callbacks(callbacks: list | None) -> tuple[list, list]:
    """HF-style callbacks go to the callback handler; Lightning callbacks go to `lightning.Trainer`."""
    import lightning.pytorch as pl

    hf_callbacks, lightning_callbacks = [], []
    for callback in callbacks or []:
        is_lightning = isinstance(callback, pl.Callback) or (
            isinstance(callback, type) and issubclass(callback, pl.Callback)
        )
        if is_lightning:
            lightning_callbacks.append(callback() if isinstance(callback, type) else callback)
        else:
            hf_callbacks.append(callback)
    return hf_callbacks, lightning_callbacks


def _value(enum_or_str: Any) -> Any:
    return getattr(enum_or_str, "value", enum_or_str)


def _is_model_parallel(model: nn.Module) -> bool:
    device_map = getattr(model, "hf_device_map", None)
    if device_map is None:
        return False
    devices = {d for d in device_map.values() if d not in ("cpu", "disk")}
    return len(devices) > 1


def _transformers_logging():
    import sys

    if sys.modules.get("transformers") is None:
        return None
    from transformers.utils import logging as transformers_logging

    return transformers_logging


def _clear_device_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    elif hasattr(torch, "mps") and torch.backends.mps.is_available():
        torch.mps.empty_cache()


def _fold_tokenizer_alias(processing_class: Any, deprecated_kwargs: dict[str, Any]) -> Any:
    """`tokenizer=` (v4) is a deprecated alias of `processing_class`; any other keyword is a TypeError."""
    given = "tokenizer" in deprecated_kwargs
    tokenizer = deprecated_kwargs.pop("tokenizer", None)
    if deprecated_kwargs:
        unexpected = next(iter(deprecated_kwargs))
        raise TypeError(f"HFLightningTrainer.__init__() got an unexpected keyword argument '{unexpected}'")
    if not given:
        return processing_class
    warnings.warn(
        "`tokenizer` is deprecated (transformers v4 name); use `processing_class` instead.",
        FutureWarning,
        stacklevel=3,
    )
    if processing_class is not None and processing_class is not tokenizer:
        raise ValueError(
            "Both `tokenizer` and `processing_class` were given with different objects; pass only one."
        )
    return tokenizer


Trainer = HFLightningTrainer


def _public_signature(init: Callable) -> inspect.Signature:
    """The reference's constructor signature: the hidden v4 `tokenizer=` keyword is not advertised."""
    signature = inspect.signature(init)
    visible = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    return signature.replace(parameters=visible)


HFLightningTrainer.__init__.__signature__ = _public_signature(HFLightningTrainer.__init__)
