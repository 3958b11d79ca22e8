"""The cross-process operations of `trainer.accelerator`, with accelerate's meanings.

Once a run exists they go through its Lightning strategy (`all_gather`, `reduce`, `broadcast`, `barrier`); before
the first `train()` through torch.distributed's default group, created on first use from the launcher's variables
(the group Lightning's strategy later reuses); in a single process they return what they are given. Tensors in
nested lists / tuples / dicts are handled one by one, as accelerate's `recursively_apply` does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from hf_lightning.engine.accelerator.ports import AcceleratorOwner
from hf_lightning.engine.accelerator.state import lightning_strategy, num_processes
from hf_lightning.strategies import distributed

_REDUCTIONS = ("sum", "mean", "max")


def apply_to_tensors(function: Callable[[torch.Tensor], Any], data: Any, what: str) -> Any:
    """`function` on every tensor of a nested list / tuple / dict; any other leaf is a TypeError naming `what`."""
    if isinstance(data, (list, tuple)):
        items = [apply_to_tensors(function, item, what) for item in data]
        return type(data)(*items) if hasattr(data, "_fields") else type(data)(items)
    if isinstance(data, Mapping):
        return type(data)({key: apply_to_tensors(function, value, what) for key, value in data.items()})
    if isinstance(data, torch.Tensor):
        return function(data)
    raise TypeError(
        f"accelerator.{what} handles tensors in nested lists, tuples and dicts, not {type(data).__name__}; "
        "use accelerator.gather_object for other picklable objects."
    )


def is_multi_process(trainer: AcceleratorOwner) -> bool:
    """Whether the run has several processes; makes sure their process group exists before a collective."""
    if num_processes(trainer) <= 1:
        return False
    if lightning_strategy(trainer) is None:
        distributed.ensure_process_group(trainer.args)
    return True


def barrier(trainer: AcceleratorOwner) -> None:
    """Wait for every process (the strategy's `barrier`)."""
    if not is_multi_process(trainer):
        return
    strategy = lightning_strategy(trainer)
    if strategy is not None:
        strategy.barrier("accelerator.wait_for_everyone")
    else:
        dist.barrier()


def _all_gather(trainer: AcceleratorOwner, tensor: torch.Tensor) -> torch.Tensor:
    """Every process's `tensor` stacked on a new dim 0, in rank order."""
    strategy = lightning_strategy(trainer)
    if strategy is not None:
        return strategy.all_gather(tensor)
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.stack(parts)


def gather(trainer: AcceleratorOwner, data: Any) -> Any:
    """Every process's tensors concatenated on dim 0 in rank order (0-d tensors become 1-d), as accelerate's."""
    if not is_multi_process(trainer):
        return data

    def gather_one(tensor: torch.Tensor) -> torch.Tensor:
        stacked = _all_gather(trainer, tensor.contiguous())
        return stacked if tensor.ndim == 0 else stacked.reshape(-1, *tensor.shape[1:])

    return apply_to_tensors(gather_one, data, "gather")


def gather_object(trainer: AcceleratorOwner, data: Any) -> list[Any]:
    """Every process's list of picklable objects, flattened in rank order (a single process: `data` as is).

    As accelerate's, each process's object is iterated: pass a list.
    """
    if not is_multi_process(trainer):
        return data
    try:
        iter(data)
    except TypeError:
        raise TypeError(
            f"accelerator.gather_object flattens each process's list; got a {type(data).__name__}: pass "
            f"[{type(data).__name__}] to gather one object per process."
        ) from None
    gathered: list[Any] = [None] * num_processes(trainer)
    dist.all_gather_object(gathered, data)
    return [item for part in gathered for item in part]


def reduce(trainer: AcceleratorOwner, data: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
    """A reduced copy of every tensor across processes: "sum", "mean" or "max" (accelerate's `reduce`)."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"accelerator.reduce: reduction must be one of {_REDUCTIONS}, got {reduction!r}.")
    multi = is_multi_process(trainer)
    strategy = lightning_strategy(trainer)
    processes = num_processes(trainer)

    def reduce_one(tensor: torch.Tensor) -> torch.Tensor:
        copy = tensor.clone()
        if not multi:
            return copy
        if strategy is not None and reduction == "sum":
            copy = strategy.reduce(copy, reduce_op="sum")
        else:
            dist.all_reduce(copy, dist.ReduceOp.MAX if reduction == "max" else dist.ReduceOp.SUM)
        if reduction == "mean":
            copy /= processes
        return copy

    return apply_to_tensors(reduce_one, data, "reduce")


def broadcast(trainer: AcceleratorOwner, data: Any, from_process: int = 0) -> Any:
    """Every tensor overwritten in place with process `from_process`'s (accelerate's `broadcast`)."""
    if not is_multi_process(trainer):
        return data
    strategy = lightning_strategy(trainer)

    def broadcast_one(tensor: torch.Tensor) -> torch.Tensor:
        if strategy is not None:
            tensor.copy_(strategy.broadcast(tensor, src=from_process))
        else:
            dist.broadcast(tensor, src=from_process)
        return tensor

    return apply_to_tensors(broadcast_one, data, "broadcast")


def broadcast_object_list(trainer: AcceleratorOwner, objects: list[Any], from_process: int = 0) -> list[Any]:
    """The list of picklable objects filled in place with process `from_process`'s."""
    if is_multi_process(trainer):
        dist.broadcast_object_list(objects, src=from_process)
    return objects


def pad_across_processes(
    trainer: AcceleratorOwner, data: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
) -> Any:
    """Every tensor padded on `dim` to the largest size any process has there (at the start with `pad_first`)."""

    def pad_one(tensor: torch.Tensor) -> torch.Tensor:
        if dim >= tensor.ndim or dim < -tensor.ndim:
            return tensor
        axis = dim % tensor.ndim
        sizes = gather(trainer, torch.tensor(tensor.shape, device=tensor.device)[None]).cpu()
        max_size = int(sizes[:, axis].max())
        if max_size == tensor.shape[axis]:
            return tensor
        new_shape = list(tensor.shape)
        new_shape[axis] = max_size
        padded = tensor.new_zeros(tuple(new_shape)) + pad_index
        start = max_size - tensor.shape[axis] if pad_first else 0
        index = tuple(
            slice(start, start + tensor.shape[axis]) if i == axis else slice(None) for i in range(tensor.ndim)
        )
        padded[index] = tensor
        return padded

    return apply_to_tensors(pad_one, data, "pad_across_processes")
