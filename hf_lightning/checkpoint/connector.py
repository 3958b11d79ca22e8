"""`CheckpointConnector`: one run's saves at the step boundary.

When to save is the flow callbacks' decision (`control.should_save`, or the evaluation connector's best-metric
rule); this connector calls the facade's overridable `_save_checkpoint` and then fires `on_save`.
"""

from __future__ import annotations

from hf_lightning.engine.protocols import RunLike, TrainerLike


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
