"""Tensor-parallel state as a one-process run holds it: full weights and optimizer state gathered from the DTensor
shards (every rank calls these: they are collectives), loaded back by slicing the full tensors like the parameters,
and the gradient norm over all shards for clipping."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from hf_lightning.strategies.ports import ProcessLayout

__all__ = [
    "clip_tp_grad_norm",
    "full_optimizer_state",
    "full_state_dict",
    "is_tp_sharded",
    "load_full_optimizer_state",
    "load_full_state_dict",
    "trainer_tp_size",
]


def _dtensor_class() -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor


def trainer_tp_size(trainer: ProcessLayout) -> int:
    """The trainer's tensor-parallel size, its `get_tp_size()` (hf_lightning/trainer/optimizer_methods.py; a subclass
    may override it)."""
    return trainer.get_tp_size()


def is_tp_sharded(model: Any) -> bool:
    """Whether any parameter of `model` is a DTensor (the tensor-parallel plan was applied)."""
    import sys

    if "torch.distributed.tensor" not in sys.modules or not isinstance(model, nn.Module):
        return False
    dtensor = _dtensor_class()
    return any(isinstance(p, dtensor) for p in model.parameters())


def _full(value: Any) -> Any:
    if isinstance(value, _dtensor_class()):
        value = value.full_tensor()
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().contiguous()
    return value


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict, unsharded and on the CPU, on every rank (what a one-process run saves)."""
    return {key: _full(value) for key, value in model.state_dict().items()}


def _like(target: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """`full` laid out as `target`: this rank's slice for a DTensor (rank 0's values), else `full` itself."""
    dtensor = _dtensor_class()
    full = full.to(device=target.device, dtype=target.dtype)
    if isinstance(target, dtensor):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full, target.device_mesh, target.placements)
    return full


def load_full_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> Any:
    """Load full (unsharded) weights into a tensor-parallel model, non-strict; returns missing / unexpected keys."""
    dtensor = _dtensor_class()
    own = model.state_dict()
    missing = [key for key in own if key not in state_dict]
    unexpected = [key for key in state_dict if key not in own]
    with torch.no_grad():
        for key, target in own.items():
            if key not in state_dict:
                continue
            value = _like(target, state_dict[key])
            if isinstance(target, dtensor):
                target.to_local().copy_(value.to_local())
            else:
                target.copy_(value)
    return nn.modules.module._IncompatibleKeys(missing, unexpected)


def full_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """`optimizer.state_dict()` with every DTensor state (Adam's moments) gathered to a full CPU tensor."""
    state = optimizer.state_dict()
    return {
        "state": {
            index: {name: _full(value) for name, value in entry.items()}
            for index, entry in state["state"].items()
        },
        "param_groups": state["param_groups"],
    }


def load_full_optimizer_state(optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> None:
    """Load a `full_optimizer_state` into the same run's optimizer: each full tensor sliced like its parameter."""
    saved_groups = state["param_groups"]
    if len(saved_groups) != len(optimizer.param_groups) or any(
        len(saved["params"]) != len(group["params"])
        for saved, group in zip(saved_groups, optimizer.param_groups)
    ):
        raise ValueError(
            "the checkpoint's optimizer state does not match this run's parameter groups; resume a tensor-parallel "
            "run from a checkpoint of a run with the same model and parallelism_config"
        )
    index_to_param = {}
    for saved, group in zip(saved_groups, optimizer.param_groups):
        index_to_param.update(zip(saved["params"], group["params"]))
    dtensor = _dtensor_class()
    sliced = {}
    for index, entry in state["state"].items():
        param = index_to_param[index]
        sliced[index] = {
            name: _like(param, value)
            if isinstance(value, torch.Tensor) and isinstance(param, dtensor) and value.shape == param.shape
            else value
            for name, value in entry.items()
        }
    optimizer.load_state_dict({"state": sliced, "param_groups": saved_groups})


def clip_tp_grad_norm(
    parameters: Iterable[torch.Tensor], max_norm: float | None, inv_scale: float | None = None
) -> torch.Tensor:
    """Clip the gradients of a tensor-parallel model at `max_norm` (None: measure only) by their total 2-norm over every shard (the
    one-process norm), and return that pre-clip norm. Sharded DTensor gradients are reduced across the
    tensor-parallel ranks (one collective); replicated ones and plain tensors (identical on every rank) count
    once. As `torch.nn.utils.clip_grad_norm_`: no host sync, a non-finite norm is returned, not raised."""
    dtensor = _dtensor_class()
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    local = [g.to_local() if isinstance(g, dtensor) else g for g in grads]
    device = local[0].device
    total_square = torch.zeros((), dtype=torch.float32, device=device)
    partial = None  # the sharded gradients' sum of squares, a Partial DTensor until reduced
    for grad, local_grad in zip(grads, local):
        if isinstance(grad, dtensor) and any(placement.is_shard() for placement in grad.placements):
            square = grad.detach().to(torch.float32).pow(2).sum()
            partial = square if partial is None else partial + square
        else:
            total_square = total_square + local_grad.detach().to(torch.float32).pow(2).sum().to(device)
    if partial is not None:
        total_square = total_square + partial.full_tensor().to(device)
    total = total_square.sqrt()
    if inv_scale is not None:
        total = total * inv_scale
    if max_norm is not None:
        # fp16: the scaled gradients are clipped by the same factor (unscale-then-clip).
        coefficient = (max_norm / (total + 1e-6)).clamp(max=1.0)
        with torch.no_grad():
            for local_grad in local:
                local_grad.mul_(coefficient.to(local_grad.device, local_grad.dtype))
    return total
