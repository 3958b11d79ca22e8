"""`LoggingConnector`: one run's training-loss window and the reference's per-step log entry.

The facade's `_maybe_log_save_evaluate` asks for an entry when the flow callbacks set `should_log`; this connector
turns the window since the last entry into `loss` / `grad_norm` / `learning_rate` (EVAL-2.17) and keeps the total
that becomes `train_loss`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch

from hf_lightning.engine.loss_window import TrainLossWindow

if TYPE_CHECKING:
    from hf_lightning.args.training_args import TrainingArguments
    from hf_lightning.callbacks import TrainerState
    from hf_lightning.engine.telemetry.meter import TelemetryMeter


class LogHooks(Protocol):
    """The trainer as the training log sees it: the reference-named `log` and `store_flos`, the loss's mean across
    processes, the learning rate, and the telemetry that closes a window with each entry."""

    args: TrainingArguments
    state: TrainerState
    _telemetry: TelemetryMeter | None

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None: ...
    def store_flos(self) -> None: ...
    def _gather_mean(self, tensor: torch.Tensor) -> torch.Tensor: ...
    def _get_learning_rate(self) -> float: ...


class LoggedRun(Protocol):
    """The run as the training log sees it: when its attempt started (the log's speed figures)."""

    start_time: float


class LoggingConnector:
    """The loss window since the last training log, the run's loss total and the step last logged."""

    def __init__(self, facade: LogHooks, run: LoggedRun):
        self._facade = facade
        self._run = run
        self.loss = TrainLossWindow(facade.args.device)
        self.total_loss_scalar = 0.0
        self.globalstep_last_logged = 0

    def begin(self, global_step: int) -> None:
        """A fresh window and total for an attempt starting at `global_step` (0, or the resumed step)."""
        self.loss = TrainLossWindow(self._facade.args.device)
        self.total_loss_scalar = 0.0
        self.globalstep_last_logged = global_step

    def log_training_window(self, grad_norm: Any, learning_rate: float | None) -> None:
        """Log the mean loss per update since the last entry, the gradient norm and the learning rate."""
        facade = self._facade
        global_step = facade.state.global_step
        tr_loss_scalar = facade._gather_mean(self.loss.settle()).item()
        self.loss.reset()
        logs: dict[str, float] = {"loss": tr_loss_scalar / (global_step - self.globalstep_last_logged)}
        if grad_norm is not None:
            logs["grad_norm"] = grad_norm.item() if isinstance(grad_norm, torch.Tensor) else grad_norm
        logs["learning_rate"] = learning_rate if learning_rate is not None else facade._get_learning_rate()
        self.total_loss_scalar += tr_loss_scalar
        self.globalstep_last_logged = global_step
        facade.store_flos()
        if facade._telemetry is not None:  # the window's throughput and time shares (engine/telemetry/meter.py)
            facade._telemetry.close_window(logs)
        facade.log(logs, self._run.start_time)

    def training_loss(self, num_steps_trained: int) -> float:
        """The run's `train_loss`: every logged window plus the unlogged rest, per update trained."""
        self.total_loss_scalar += self.loss.settle().item()
        return self.total_loss_scalar / max(num_steps_trained, 0.001)
