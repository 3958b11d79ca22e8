"""Lightning's logger connector without its per-batch bookkeeping while nothing was logged with `self.log`.

After every training batch Lightning's `_LoggerConnector` rebuilds the step's metric dicts from its result
collection and hands them to the loggers. The engine never calls
`self.log` (the facade logs through `log_history`), so unless a user's Lightning callback does, the collection
is empty and those dicts are empty: the work changes nothing, yet it costs a few microseconds per step (the
`tiny` workload in benchmarks/). `LeanLoggerConnector` skips exactly that case and defers to Lightning for
everything else, so a callback calling `pl_module.log(...)` is logged as before.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.trainer.connectors.logger_connector.logger_connector import _LoggerConnector
from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultCollection
from lightning.pytorch.trainer.states import RunningStage

__all__ = ["LeanLoggerConnector", "use_lean_logger_connector"]


class LeanLoggerConnector(_LoggerConnector):
    """`_LoggerConnector` with the training-batch-end hooks short-cut while the result collection is empty."""

    def _training_results(self) -> _ResultCollection | None:
        """The training result collection when the fit loop is training (what `trainer._results` resolves to
        then, read without its chain of stage comparisons), else None."""
        trainer = self.trainer
        if trainer.state.stage is RunningStage.TRAINING:
            return trainer.fit_loop.epoch_loop._results
        return None

    def on_batch_start(self, batch: Any, dataloader_idx: int | None = None) -> None:
        results = self._training_results()
        if results is None:
            super().on_batch_start(batch, dataloader_idx)
            return
        # Lightning's own update, with the collection found directly rather than through `trainer._results`.
        if self._first_loop_iter is None:
            self._first_loop_iter = True
        elif self._first_loop_iter is True:
            self._first_loop_iter = False
        results.batch = batch
        results.batch_size = None
        results.dataloader_idx = dataloader_idx

    def on_batch_end(self) -> None:
        results = self._training_results()
        if results is None or len(results):
            super().on_batch_end()
            return
        # An empty collection yields empty metric dicts: the three updates would change nothing.
        assert isinstance(self._first_loop_iter, bool)
        results.batch = None
        results.batch_size = None

    def update_train_step_metrics(self) -> None:
        results = self._training_results()
        if results is not None and not len(results):
            return  # nothing logged: `log_metrics` would return on the empty dict
        super().update_train_step_metrics()


def use_lean_logger_connector(trainer: pl.Trainer) -> None:
    """Give `trainer` the lean connector, keeping the state `Trainer.__init__` configured on its own one."""
    connector = trainer._logger_connector
    if type(connector) is _LoggerConnector:
        connector.__class__ = LeanLoggerConnector
