"""The process group and the collectives evaluation needs (accelerate's `gather` / `pad_across_processes`).

One place creates the default `torch.distributed` process group (`ensure_process_group`, from
`hf_lightning/args/process_group.py`): evaluate() and
predict() may run before any `train()`, i.e. before Lightning's DDP strategy would create it. Lightning
reuses a group that is already initialised. The collectives below mirror accelerate's, which the reference's
evaluation loop calls: tensors gathered in rank order on dim 0, padded across processes with a pad value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from hf_lightning.args.process_group import ensure_process_group, under_elastic_agent
from hf_lightning.data.sized import has_length

if TYPE_CHECKING:
    from hf_lightning.translation.plan import ModuleSettings

__all__ = [
    "all_reduce_sum",
    "all_tensors",
    "barrier",
    "check_even_eval_shards",
    "ensure_process_group",
    "gather",
    "gather_object",
    "is_distributed",
    "pad_across_processes",
    "under_elastic_agent",
    "world_size",
]

def is_distributed() -> bool:
    """Whether a default process group with more than one process is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def any_process(flag: bool, device: Any = None) -> bool:
    """Whether `flag` is true on any process (one all-reduce of a one-element tensor under several processes; every
    process must call it at the same point)."""
    if not is_distributed():
        return flag
    tensor = torch.tensor([int(flag)], device=device or "cpu")
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


def world_size() -> int:
    """Processes in the default group (1 when none is initialised)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def barrier() -> None:
    """Wait for every process of the default group; a no-op in a single process."""
    if is_distributed():
        dist.barrier()


def _apply(function: Callable[[torch.Tensor], torch.Tensor], data: Any) -> Any:
    """Apply `function` to every tensor of a nested list / tuple / dict (accelerate's `recursively_apply`)."""
    if isinstance(data, (list, tuple)):
        items = [_apply(function, item) for item in data]
        # Named tuples are rebuilt from positional fields, as accelerate's `honor_type` does.
        return type(data)(*items) if hasattr(data, "_fields") else type(data)(items)
    if isinstance(data, Mapping):
        return type(data)({key: _apply(function, value) for key, value in data.items()})
    if isinstance(data, torch.Tensor):
        return function(data)
    raise TypeError(
        f"Cannot gather an object of type {type(data).__name__} across processes: only nested lists, tuples and "
        "dicts of tensors are gathered as tensors (set eval_use_gather_object=True to gather other objects)."
    )


def all_tensors(data: Any) -> bool:
    """Whether `data` is a tensor or a nested list / tuple / dict holding only tensors."""
    if isinstance(data, (list, tuple)):
        return all(all_tensors(item) for item in data)
    if isinstance(data, Mapping):
        return all(all_tensors(value) for value in data.values())
    return isinstance(data, torch.Tensor)


def _gather_one(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.ndim == 0:
        tensor = tensor.clone()[None]
    tensor = tensor.contiguous()
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor)
    return torch.cat(parts, dim=0)


def gather(data: Any) -> Any:
    """Every process's tensors concatenated on dim 0 in rank order (0-d tensors become 1-d).

    Each process must pass tensors of the same shapes (pad them with `pad_across_processes` first). A single
    process returns `data` unchanged.
    """
    if not is_distributed():
        return data
    return _apply(_gather_one, data)


def gather_object(data: Any) -> list[Any]:
    """Every process's list of picklable objects, flattened in rank order (accelerate's `gather_object`)."""
    if not is_distributed():
        return data
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, data)
    return [item for part in gathered for item in part]


def pad_across_processes(data: Any, dim: int = 0, pad_index: int = 0) -> Any:
    """Pad every tensor on `dim` (at the end) to the largest size any process has there.

    Tensors with fewer than `dim + 1` dimensions are left as they are. A single process returns `data`
    unchanged.
    """
    if not is_distributed():
        return data

    def pad(tensor: torch.Tensor) -> torch.Tensor:
        if dim >= tensor.ndim or dim < -tensor.ndim:
            return tensor
        axis = dim % tensor.ndim
        sizes = _gather_one(torch.tensor(tensor.shape, device=tensor.device)[None])
        max_size = int(sizes[:, axis].max())
        if max_size == tensor.shape[axis]:
            return tensor
        new_shape = list(tensor.shape)
        new_shape[axis] = max_size
        padded = tensor.new_full(new_shape, pad_index)
        padded[tuple(slice(0, n) for n in tensor.shape)] = tensor
        return padded

    return _apply(pad, data)


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of `tensor` over processes (a copy; a single process returns it unchanged)."""
    if not is_distributed():
        return tensor
    tensor = tensor.clone()
    dist.all_reduce(tensor)
    return tensor


def check_even_eval_shards(args: Any, dataset: Any, settings: ModuleSettings) -> None:
    """Refuse evaluation shards of different lengths, which would leave processes waiting in the gather.

    With `accelerator_config.even_batches=False` and a dataset size that is not a multiple of the global
    eval batch, the processes get different numbers (or sizes) of batches. `settings`: the trainer's plan's module
    section (its `even_batches` / `split_batches`).
    """
    total_batch_size = args.eval_batch_size * args.world_size
    if (
        not settings.even_batches
        and not settings.split_batches
        and has_length(dataset)
        and len(dataset) % total_batch_size != 0
    ):
        raise ValueError(
            f"accelerator_config.even_batches=False with {len(dataset)} evaluation samples, which is not a "
            f"multiple of eval_batch_size x world_size = {total_batch_size}: the processes would get different "
            "numbers of batches and block in the gather. Leave even_batches=True (the repeated samples are "
            "dropped from the results) or make the dataset size a multiple of the global batch."
        )
