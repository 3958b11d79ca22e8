"""`enable_jit_checkpoint`: the `TrainerCallback` that turns a SIGTERM into a checkpoint at the next update boundary.

The callback sits in the facade's callback list from construction (as the reference's, right after the flow
callback), so this module imports no Lightning: `from hf_lightning import Trainer` must not (the engine's signal
handling during fit, which does, is hf_lightning/engine/signals.py). Its `request` is the SIGTERM handler while
`train()` runs: the request counts at once and is served at the next `on_step_end` or epoch end, where the step is
saved by the usual save path (after its log and evaluation) and training stops; `train()` returns normally. Under DDP
every process learns of a request made on any of them through one small all-reduce per update, so all stop at the
same step.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from hf_lightning.callbacks import TrainerCallback

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from hf_lightning.callbacks import TrainerState

logger = logging.getLogger(__name__)


class JITOwner(Protocol):
    """The trainer as the SIGTERM checkpoint sees it: the run's Lightning trainer (its device) and the state."""

    lightning_trainer: pl.Trainer | None
    state: TrainerState


class JITCheckpointCallback(TrainerCallback):
    """`enable_jit_checkpoint`: on SIGTERM, save a checkpoint at the next update boundary and stop training."""

    def __init__(self, facade: JITOwner):
        self._facade = facade
        self.requested = False
        self.pending = False  # a checkpoint is due at this boundary's save

    def request(self, signum: int, frame: Any) -> None:
        """The SIGTERM handler: only records the request (the save happens at the next update boundary)."""
        if not self.requested:
            logger.info("SIGTERM received: a checkpoint will be saved at the next update boundary.")
        self.requested = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self._agreed():
            self._save_and_stop(control)
        return control

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self._agreed():
            self._save_and_stop(control)
        return control

    def _agreed(self) -> bool:
        """Whether any process received SIGTERM: an all-reduce of the flag under DDP (every process calls it)."""
        # lazy: this module is imported with the facade and imports no Lightning
        from hf_lightning.strategies.distributed import any_process

        device = getattr(getattr(self._facade.lightning_trainer, "strategy", None), "root_device", None)
        return any_process(self.requested, device)

    def _save_and_stop(self, control: Any) -> None:
        # The step's own save path writes it, after the step's log and evaluation, so the checkpoint's log history
        # is complete; then the loop stops as after any `should_training_stop`.
        self.requested = False
        self.pending = True
        logger.info(f"Saving the SIGTERM checkpoint at step {self._facade.state.global_step}, then stopping.")
        control.should_training_stop = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.pending = False
        return control
