"""`TrainerLike` and `RunLike`: what one run's code uses of the facade and of the run.

The facade (`trainer/trainer.py`) calls into the run's code (`training_run.py`, `module.py`, the run's components,
`checkpoint/resume.py`); naming the facade's class there would make each module depend on the other. `TrainerLike`
states the surface instead: the reference-named attributes and methods a `Trainer` subclass may override, and the
one reference to the current run (`_training_run`). `RunLike` is what the module, the components and the facade's
step methods read of that run (engine/training_run.py's `TrainingRun`, which imports them).
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

    # ---- the reference's, set by each train() and kept after it ---------------------------------------
    state: Any  # TrainerState
    control: Any  # TrainerControl
    lightning_trainer: Any  # lightning.pytorch.Trainer
    _checkpointer: Any  # checkpoint.checkpointer.Checkpointer, the trainer's checkpoint saves
    _telemetry: Any  # engine.telemetry.meter.TelemetryMeter, None when the telemetry is off
    is_in_train: bool
    current_gradient_accumulation_steps: int
    _trial: Any  # also set by `_hp_search_setup`; `TrainerState.init_training_references` reads it
    # ---- across runs: a later evaluate() or train() reads them -----------------------------------------
    _model_is_prepared: bool
    _loggers_before_training: list[Any] | None
    # ---- the current train() call (None outside): it owns every per-run value -------------------------
    _training_run: Any  # RunLike | None

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
    def _determine_best_metric(self, metrics: dict[str, float], trial: Any) -> bool: ...
    def _save_checkpoint(self, model: Any, trial: Any) -> None: ...
    def _gather_mean(self, tensor: torch.Tensor) -> torch.Tensor: ...
    def _issue_warnings_after_load(self, load_result: Any) -> None: ...
    @property
    def _checkpoint_io(self) -> Any: ...  # strategies.checkpoint_io.StrategyCheckpointIO of the planned strategy
    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None: ...
    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None: ...
    def _load_scaler(self, checkpoint: str | None) -> None: ...
    def _load_rng_state(self, checkpoint: str | None) -> None: ...
    def _load_callback_state(self) -> None: ...
    def _load_best_model(self) -> None: ...

    def _finish_current_push(self) -> None: ...


class RunLike(Protocol):
    """One `train()` call as the Lightning module, the run's components and the facade's step methods see it."""

    facade: TrainerLike
    trial: Any
    ignore_keys_for_eval: list[str] | None
    values: Any  # engine.schedule.TrainingValues, set by each attempt
    start_time: float
    updates_done_in_epoch: int
    initial_global_step: int
    initial_num_input_tokens_seen: int
    last_grad_norm: Any
    last_learning_rate: float | None
    module: Any  # engine.module.HFLightningModule
    lightning_trainer: Any
    fitting: bool
    resume: Any  # checkpoint.resume.Resumer
    logging: Any  # engine.logging_connector.LoggingConnector
    checkpointing: Any  # checkpoint.checkpointer.Checkpointer
    signals: Any  # engine.signals.SignalScope
    guard: Any  # engine.run_guard.RunGuard, None when off
    skipped_windows: Any  # engine.guard_path.SkippedWindows
    rollback_to: str | None
    guard_halted: bool
    guard_stop: str | None
