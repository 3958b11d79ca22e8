"""The facade's optimizer, scheduler and batch-size methods (the reference's names and rules).

A mixin of `HFLightningTrainer`: each method is overridable and called at the reference's call site
(`create_optimizer` / `create_scheduler` from the LightningModule's `configure_optimizers`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

import hf_lightning.engine.schedule as schedule
import hf_lightning.optim.optimizers as optim_layer
from hf_lightning.data.sized import has_length
from hf_lightning.optim.schedulers import get_scheduler

_PLATEAU_SCHEDULER_NAMES = ("ReduceLROnPlateau", "GreedyLR")


class OptimizerMixin:
    """Optimizer and scheduler creation, learning-rate access and the run's batch arithmetic."""

    # ---- optimizer and scheduler ---------------------------------------------------------------------
    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        """Parameter names that get weight decay (not LayerNorm, bias or norm-named ones)."""
        return optim_layer.get_decay_parameter_names(model)

    @staticmethod
    def get_optimizer_cls_and_kwargs(args: Any, model: nn.Module | None = None) -> tuple[Any, Any]:
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
        """The last update's learning rate, the strategy's way (DeepSpeed: 0 until fp16 loss-scale warm-up steps)."""
        return self._strategy_steps.learning_rate(
            self.optimizer, self.lr_scheduler, from_optimizer=self._scheduler_waits_for_metrics()
        )

    # ---- batch sizes ------------------------------------------------------------------------------------
    def get_total_train_batch_size(self, args: Any) -> int:
        """Micro-batch x accumulation x data-parallel world size (R2.7)."""
        dp_world_size = args.world_size // (self.get_tp_size() * self.get_cp_size() * self.get_sp_size())
        return self._train_batch_size * self.plan.module.gradient_accumulation_steps * dp_world_size

    def get_tp_size(self) -> int:
        """Tensor-parallel size: parallelism_config's tp_size when the run is tensor parallel, else 1."""
        # Before the constructor has translated the arguments (the accelerator's layout is read while the model
        # is built under several processes) the plan is None: no tensor parallelism yet.
        strategy = self.plan.strategy if self.plan is not None else None
        return strategy.tensor_parallel_size if strategy is not None else 1

    def _data_parallel_layout(self) -> tuple[int, int]:
        """(replicas, this process's replica): the tensor-parallel ranks of one replica read the same batches, as
        accelerate deals them (`process_index // tp_size` of `world_size // tp_size`)."""
        tp_size = self.get_tp_size()
        return self.args.world_size // tp_size, self.args.process_index // tp_size

    def get_cp_size(self) -> int:
        """Context-parallel size (1)."""
        return 1

    def get_sp_size(self) -> int:
        """Sequence-parallel size (1)."""
        return 1

    def set_initial_training_values(self, args: Any, dataloader: DataLoader) -> tuple:
        """The reference's 7-tuple: epochs, updates per epoch, examples, samples, total batch, steps/epoch, max_steps."""
        len_dataloader = len(dataloader) if has_length(dataloader) else None
        return schedule.initial_training_values(
            max_steps_arg=args.max_steps,
            num_train_epochs_arg=args.num_train_epochs,
            gradient_accumulation_steps=self.plan.module.gradient_accumulation_steps,
            len_dataloader=len_dataloader,
            num_examples_in_loader=self.num_examples(dataloader) if len_dataloader else None,
            total_train_batch_size=self.get_total_train_batch_size(args),
        ).as_tuple()
