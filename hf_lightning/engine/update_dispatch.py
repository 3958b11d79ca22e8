"""Backward and optimizer step of one update, with Lightning's hook dispatch skipped when it would do nothing.

On the plain single-device strategy in full precision, `manual_backward` and `LightningOptimizer.step` add
only hook calls around `loss.backward()` and `optimizer.step()`: `on_before_backward`, `on_after_backward`
and `on_before_optimizer_step` on every callback and the module, and a closure around the step. When none
of them overrides those hooks and no profiler records them, that dispatch is pure per-step overhead
(measured by the `tiny` workload in benchmarks/), so the update calls the two directly. Lightning's
optimizer-step progress, which is its `global_step`, is counted either way.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden

from hf_lightning.engine.lean_lightning import is_pass_through_profiler
from hf_lightning.strategies.steps import lightning_update_is_plain

__all__ = ["UpdateDispatch", "hook_dispatch_is_idle"]

# The hooks Lightning dispatches around a manual backward and a manual optimizer step.
_DISPATCHED_HOOKS = ("on_before_backward", "on_after_backward", "on_before_optimizer_step")


def hook_dispatch_is_idle(trainer: pl.Trainer) -> bool:
    """Whether Lightning's backward / optimizer-step dispatch would only call hooks nobody overrides."""
    if not lightning_update_is_plain(trainer.strategy):
        return False  # other strategies and precision plugins do real work there (scaling, sync, engines)
    if not is_pass_through_profiler(trainer.profiler):
        return False  # a profiler (a subclass of the pass-through one included) times the dispatched hooks
    module = trainer.lightning_module
    if any(is_overridden(name, module, pl.LightningModule) for name in (*_DISPATCHED_HOOKS, "backward")):
        return False
    return not any(
        is_overridden(name, callback, pl.Callback)
        for callback in trainer.callbacks
        for name in _DISPATCHED_HOOKS
    )


class UpdateDispatch:
    """Runs backward and the optimizer step through Lightning, or directly when `hook_dispatch_is_idle`.

    Decided once per fit (`reset` at the start of training), since callbacks, strategy and profiler are fixed
    by then.
    """

    def __init__(self) -> None:
        self._direct: bool | None = None

    def reset(self) -> None:
        self._direct = None

    def direct(self, trainer: pl.Trainer) -> bool:
        if self._direct is None:
            self._direct = hook_dispatch_is_idle(trainer)
        return self._direct

    def _is_direct(self, module: pl.LightningModule) -> bool:
        # The decision once made, without reading `module.trainer` (a checked property) on every step.
        direct = self._direct
        return self.direct(module.trainer) if direct is None else direct

    def backward(self, module: pl.LightningModule, loss: torch.Tensor) -> None:
        if self._is_direct(module):
            loss.backward()
        else:
            module.manual_backward(loss)

    def optimizer_step(self, module: pl.LightningModule, optimizer: Any) -> None:
        """`optimizer` is the `LightningOptimizer` of `module.optimizers()`."""
        if self._is_direct(module):
            # What `LightningOptimizer.step` does around the strategy's step: the manual loop's progress hooks.
            optimizer._on_before_step()
            optimizer.optimizer.step()
            optimizer._on_after_step()
        else:
            optimizer.step()
