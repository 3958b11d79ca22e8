"""`TrainerLike`: what one run's code (`training_run.py`, `module.py`, `checkpoint/resume.py`) uses of the facade.

The facade (`engine/trainer.py`) calls into that code; naming the facade's class there would make each module
depend on the other. This Protocol states the surface instead: the reference-named attributes and methods a
`Trainer` subclass may override, and the per-run attributes the run sets on the facade because the reference
keeps them as private trainer attributes (subclasses and callbacks read some of them).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.data import DataLoader


class TrainerLike(Protocol):
    """The facade as the training run, the Lightning module and the resume code see it."""

    # ---- set at construction ----------------------------------------------------------------------
    args: Any
    model: nn.Module
    model_wrapped: nn.Module
    model_init: Any
    optimizer: torch.optim.Optimizer | None
    lr_scheduler: Any
    plan: Any
    callback_handler: Any
    lightning_callbacks: list[Any]
    lightning_trainer_overrides: dict[str, Any] | None
    neftune_noise_alpha: float | None
    is_model_parallel: bool
    place_model_on_device: bool
    current_flos: float
    _memory_tracker: Any
    _train_batch_size: int
    _created_lr_scheduler: bool

    # ---- set by each train() -------------------------------------------------------------------------
    state: Any  # TrainerState
    control: Any  # TrainerControl
    lightning_trainer: Any  # lightning.pytorch.Trainer
    is_in_train: bool
    current_gradient_accumulation_steps: int
    _trial: Any
    _ignore_keys_for_eval: list[str] | None
    _model_is_prepared: bool
    _resume_files: Any  # checkpoint.resume.ResumeFiles | None
    _resume: Any  # checkpoint.resume.ResumePoint | None
    _run: Any  # engine.training_run.RunBookkeeping
    _lightning_module: Any
    _loggers_before_training: list[Any] | None
    _initial_num_input_tokens_seen: int
    _initial_global_step: int
    _tr_loss: Any  # engine.loss_window.TrainLossWindow
    _total_loss_scalar: float
    _globalstep_last_logged: int
    _last_grad_norm: Any
    _last_learning_rate: float | None
    _fitting: bool

    # ---- the reference's methods ------------------------------------------------------------------
    def call_model_init(self, trial: Any = None) -> nn.Module: ...
    def get_train_dataloader(self) -> DataLoader: ...
    def set_initial_training_values(self, args: Any, dataloader: DataLoader) -> tuple: ...
    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer: ...
    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None): ...
    def get_batch_samples(
        self, epoch_iterator: Iterator, num_batches: int, device: torch.device
    ) -> tuple[list, Any]: ...
    def training_step(
        self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None
    ) -> torch.Tensor: ...
    def floating_point_ops(self, inputs: dict[str, Any]) -> int: ...
    def store_flos(self) -> None: ...
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None: ...

    # ---- the facade's own step and run methods -------------------------------------------------------
    def _fire(self, event: str) -> None: ...
    def _stateful_callbacks(self) -> list: ...
    def _hp_search_setup(self, trial: Any) -> None: ...
    def _activate_neftune(self) -> None: ...
    def _deactivate_neftune(self) -> None: ...
    def _on_epoch_begin(self, epoch: int) -> None: ...
    def _on_epoch_end(self, epoch: int, last_micro_batch_index: int) -> None: ...
    def _accumulate_loss(self, loss_step: torch.Tensor) -> None: ...
    def _track_num_input_tokens(self, inputs: dict[str, Any]) -> None: ...
    def _clip_grad_norm(self, model: nn.Module) -> float: ...
    def _get_learning_rate(self) -> float: ...
    def _scheduler_waits_for_metrics(self) -> bool: ...
    def _maybe_log_save_evaluate(
        self, grad_norm: Any, epoch: int, learning_rate: float | None = None
    ) -> None: ...
    def _evaluate(
        self, trial: Any, ignore_keys_for_eval: list[str] | None, skip_scheduler: bool = False
    ) -> dict[str, float]: ...
    def _issue_warnings_after_load(self, load_result: Any) -> None: ...
    def _load_best_model(self) -> None: ...
    def _after_training_rotation(self, trial: Any = None) -> None: ...
