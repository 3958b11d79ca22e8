"""Signals during `train()`: SIGTERM and SIGINT mean what they mean to a `transformers.Trainer` script.

Lightning's fit turns SIGTERM into an exit with status 0 and SIGINT into `SystemExit(1)`. Here instead:
- SIGTERM without `enable_jit_checkpoint`: the process ends by the signal (exit status 143 in a shell, as a
  process without a handler), after one line on stderr naming the last complete checkpoint and how to resume
  from it; no traceback. A handler the user installed before
  `train()` (or SIG_IGN) is kept in place, as Lightning's is not.
- SIGTERM with `enable_jit_checkpoint`: the request of the facade's `JITCheckpointCallback`
  (hf_lightning/engine/jit_checkpoint.py, which imports no Lightning), installed for the whole `train()` call and
  again in place of Lightning's during fit; the checkpoint is taken at the next update boundary.
- SIGINT: `KeyboardInterrupt` out of `train()` (`SystemExit` from Lightning's handling becomes it again).
- Under SLURM with Lightning's auto-requeue (its `SLURMEnvironment` plugin), Lightning's own SIGTERM handling stays
  in place; its requeue signal (SIGUSR1) is served by hf_lightning/engine/slurm_requeue.py instead of Lightning's
  handler: one complete HF checkpoint at the next update boundary, the job requeued, the process ended by the signal.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any, Protocol

import lightning.pytorch as pl

from hf_lightning.engine.interrupt_report import own_line, resume_line
from hf_lightning.engine.jit_checkpoint import JITCheckpointCallback
from hf_lightning.engine.slurm_requeue import SlurmRequeue

if TYPE_CHECKING:
    from hf_lightning.args.training_args import TrainingArguments
    from hf_lightning.callbacks import CallbackHandler, TrainerControl, TrainerState


class SignalOwner(Protocol):
    """The trainer as a `train()` call's signal handling sees it: its callbacks (the SIGTERM checkpoint one), the
    arguments, the state and control, and the run's Lightning trainer (its device)."""

    args: TrainingArguments
    state: TrainerState
    control: TrainerControl
    callback_handler: CallbackHandler
    lightning_trainer: pl.Trainer | None


TERMINATED_MESSAGE = (
    "hf_lightning: received SIGTERM during train(); the process ends now (exit status 143). Set "
    "enable_jit_checkpoint=True to save a checkpoint at the next update boundary first."
)


class SignalBridge(pl.Callback):
    """Puts this module's SIGTERM handler in place of Lightning's once fit has registered its handlers."""

    def __init__(
        self,
        jit: JITCheckpointCallback | None,
        before_train: Any,
        facade: SignalOwner | None = None,
        scope: SignalScope | None = None,
    ):
        self._jit = jit
        self._before_train = before_train  # the SIGTERM handler in place when train() began
        self._facade = facade  # for the line naming the checkpoint to resume from
        self._scope = scope  # receives the SLURM requeue request, when Lightning's auto-requeue is on
        self._lightning_trainer: pl.Trainer | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from lightning.fabric.plugins.environments import SLURMEnvironment

        # Its only hook: leave Lightning's callback list, which is otherwise walked twice per batch. Rebinding the
        # list (rather than removing from it) leaves the hook loop that is calling us undisturbed.
        trainer.callbacks = [c for c in trainer.callbacks if c is not self]
        environment = trainer._accelerator_connector.cluster_environment
        if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
            self._serve_requeue_signal(environment.requeue_signal)
            return  # Lightning's requeue protocol owns SIGTERM there
        self._lightning_trainer = trainer
        if self._jit is not None:
            handler = self._jit.request
        elif self._before_train in (signal.SIG_DFL, None):
            handler = self._terminate
        else:
            handler = self._before_train  # the user's own handler (or SIG_IGN), as without Lightning
        _install(signal.SIGTERM, handler)  # Lightning's teardown puts back the handlers it found at fit start

    def _serve_requeue_signal(self, signum: int) -> None:
        """Our requeue in place of the handler Lightning registered at fit start; a user's own handler stays."""
        from lightning.pytorch.trainer.connectors.signal_connector import _HandlersCompose

        if self._scope is None or not isinstance(signal.getsignal(signum), _HandlersCompose):
            return
        requeue = SlurmRequeue(signum)
        self._scope.requeue = requeue
        _install(signum, requeue.request)

    def _terminate(self, signum: int, frame: Any) -> None:
        """End the process by the signal itself, as a process without a SIGTERM handler ends."""
        where = ""
        if self._facade is not None and self._facade.args.process_index == 0:
            # The same line: where to resume from (engine/interrupt_report.py), without the event said above.
            facade = self._facade
            try:
                line = resume_line(facade.args.output_dir, facade.state.global_step, "Stopped")
                where = " " + line.removeprefix("hf_lightning: ")
            except Exception:  # noqa: BLE001 - the report must never keep the process from ending
                where = ""
        print(own_line(TERMINATED_MESSAGE + where), file=sys.stderr, flush=True)
        launcher = getattr(getattr(self._lightning_trainer, "strategy", None), "launcher", None)
        if launcher is not None and callable(getattr(launcher, "kill", None)):
            launcher.kill(signum)  # the processes Lightning started for this run end with this one
        for handler in logging.getLogger().handlers:
            handler.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _install(signum: int, handler: Any) -> None:
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signum, handler)


class SignalScope:
    """One `train()` call's signal handling: the JIT handler during the whole call, the bridge during fit."""

    def __init__(self, facade: SignalOwner):
        self._facade = facade
        self.jit: JITCheckpointCallback | None = None
        self.requeue: SlurmRequeue | None = None  # set at fit start under SLURM's auto-requeue
        self._before_train = signal.getsignal(signal.SIGTERM)
        for callback in facade.callback_handler.callbacks:
            if isinstance(callback, JITCheckpointCallback):
                self.jit = callback

    def __enter__(self) -> SignalScope:
        if self.jit is not None:
            self.jit.requested = self.jit.pending = False
            _install(signal.SIGTERM, self.jit.request)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.jit is not None:
            _install(signal.SIGTERM, self._before_train)

    def checkpoint_pending(self) -> bool:
        """Whether a SIGTERM or requeue checkpoint is due at the current update boundary (a requeue request also
        stops training there)."""
        if self.requeue is not None:
            facade = self._facade
            device = getattr(getattr(facade.lightning_trainer, "strategy", None), "root_device", None)
            if self.requeue.due_now(device):
                self.requeue.saved_at = facade.state.global_step
                facade.control.should_training_stop = True
                return True
        return self.jit is not None and self.jit.pending

    def end_if_requeued(self) -> None:
        """After fit, once the requeue checkpoint is complete on disk: requeue the job and end the process."""
        if self.requeue is not None and self.requeue.saved_at is not None:
            args = self._facade.args
            self.requeue.requeue_and_end(args.output_dir, args.process_index == 0)

    def lightning_callback(self) -> SignalBridge:
        """The Lightning callback that replaces Lightning's SIGTERM handler during fit."""
        return SignalBridge(self.jit, self._before_train, self._facade, self)


def keyboard_interrupt_of(exit_: SystemExit) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt Lightning turned into `SystemExit(1)` (after its graceful shutdown), if any."""
    context = exit_.__context__
    return context if isinstance(context, KeyboardInterrupt) else None
