"""`ensure_train_mode`: the model put in train mode before each micro-batch, as the reference does, without the
recursive walk when nothing would change."""

from __future__ import annotations

from torch import nn


def ensure_train_mode(model: nn.Module) -> None:
    """`model.train()`, skipped when it could change nothing: every submodule already trains and none overrides
    `train`. The reference calls it on every micro-batch; the skip saves a recursive `setattr` per submodule.

    The walk follows `_modules`, the children `nn.Module.train` itself recurses into, with a list as the stack
    rather than the `modules()` generators (about three Python calls per submodule on every step)."""
    pending, seen = [model], set()
    while pending:
        module = pending.pop()
        if module is None or module in seen:  # a child slot set to None (`train` skips it too), or shared
            continue
        seen.add(module)
        if not module.training or type(module).train is not _MODULE_TRAIN:
            model.train()
            return
        pending.extend(module._modules.values())


_MODULE_TRAIN = nn.Module.train
