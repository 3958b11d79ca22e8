"""`CheckpointConnector`: one run's saves at the step boundary.

When to save is the flow callbacks' decision (`control.should_save`, or the evaluation connector's best-metric
rule); this connector calls the facade's overridable `_save_checkpoint` and then fires `on_save`, and waits for a
background write (`checkpoint/async_writes.py`) before a resume and at the end of training.
"""

from __future__ import annotations

from hf_lightning.checkpoint.async_writes import wait_for_checkpoint_writes
from hf_lightning.core.protocols import RunLike, TrainerLike


class CheckpointConnector:
    """Saves a checkpoint during one run."""

    def __init__(self, facade: TrainerLike, run: RunLike):
        self._facade = facade
        self._run = run

    def save(self) -> None:
        """Write `checkpoint-<global_step>` through the facade's `_save_checkpoint`, then fire `on_save`."""
        facade = self._facade
        facade._save_checkpoint(facade.model, self._run.trial)
        facade.control = facade.callback_handler.on_save(facade.args, facade.state, facade.control)

    def wait_for_pending_write(self, raise_failure: bool = True) -> None:
        """Block until a background checkpoint write (`AsyncCheckpointIO`) is committed; no-op without one."""
        wait_for_checkpoint_writes(self._facade, raise_failure=raise_failure)
