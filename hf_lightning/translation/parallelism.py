"""`parallelism_config` (accelerate's `ParallelismConfig`): its sizes, the checks made before training, and
how each size maps onto the device mesh of Lightning's `ModelParallelStrategy`.

| size               | meaning (accelerate)            | hf_lightning                                                      |
|--------------------|---------------------------------|-------------------------------------------------------------------|
| dp_shard_size      | FSDP: parameters sharded        | the mesh's `data_parallel` dimension, `fully_shard` (FSDP2)        |
| dp_replicate_size  | replicas (HSDP with dp_shard)   | refused (Lightning's mesh has one data-parallel dimension)        |
| tp_size            | tensor parallel                 | the mesh's `tensor_parallel` dimension: the model's own tp plan   |
|                    |                                 | (`base_model_tp_plan`) applied as DTensor shards; alone only      |
| cp_size / sp_size  | context / sequence parallel     | refused: the mesh has no such dimension                           |

tp_size > 1 runs when it is the launch's world size (one data-parallel replica: every rank gets the same batches,
`num_items_in_batch` is divided by tp_size, evaluation gathers nothing across the tensor-parallel ranks, checkpoints
hold the full weights gathered on rank 0); tp_size with dp_shard_size > 1 is refused for now.

All sizes 1 is the reference's "no parallelism config" (accelerate then fills dp_replicate with the process
count, i.e. plain DDP), so the run's strategy is left as without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "SIZE_FIELDS",
    "mesh_description",
    "parallelism_refusal",
    "parallelism_sizes",
    "shards_parameters",
    "tensor_parallel_size",
]

SIZE_FIELDS = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")


def parallelism_sizes(value: Any) -> dict[str, int] | None:
    """The five sizes of a `ParallelismConfig` (or a dict with those keys), unset ones as 1; None for None."""
    if value is None:
        return None
    if not any(
        (name in value) if isinstance(value, Mapping) else hasattr(value, name) for name in SIZE_FIELDS
    ):
        raise ValueError(
            f"parallelism_config={type(value).__name__} has none of {', '.join(SIZE_FIELDS)}: pass accelerate's "
            "ParallelismConfig (or a dict of those sizes), R7.5 in docs/reference-behaviour.md"
        )
    sizes = {}
    for name in SIZE_FIELDS:
        size = value.get(name) if isinstance(value, Mapping) else getattr(value, name, None)
        if size is None:
            size = 1
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"parallelism_config.{name}={size!r}: use a whole number of at least 1")
        sizes[name] = size
    return sizes


def shards_parameters(value: Any) -> bool:
    """Whether the config asks for sharded data parallelism (dp_shard_size > 1): FSDP2 over the mesh."""
    try:
        sizes = parallelism_sizes(value)
    except ValueError:
        return False
    return sizes is not None and sizes["dp_shard_size"] > 1


def tensor_parallel_size(value: Any) -> int:
    """The config's tp_size (1 without a config or for a malformed one, which the translation refuses)."""
    try:
        sizes = parallelism_sizes(value)
    except ValueError:
        return 1
    return 1 if sizes is None else sizes["tp_size"]


def parallelism_refusal(sizes: Mapping[str, int], world_size: int) -> str | None:
    """Why these sizes cannot run on `world_size` processes under hf_lightning, naming the field; None if they can."""
    if all(size == 1 for size in sizes.values()):
        return None
    for name, what in (("cp_size", "context"), ("sp_size", "sequence")):
        if sizes[name] > 1:
            return (
                f"parallelism_config.{name}={sizes[name]}: {what} parallelism is not supported by hf_lightning "
                "(Lightning's ModelParallelStrategy mesh has data-parallel and tensor-parallel dimensions only); "
                f"set {name}=1"
            )
    if sizes["tp_size"] > 1 and (sizes["dp_shard_size"] > 1 or sizes["dp_replicate_size"] > 1):
        other = "dp_shard_size" if sizes["dp_shard_size"] > 1 else "dp_replicate_size"
        return (
            f"parallelism_config.tp_size={sizes['tp_size']} with {other}={sizes[other]}: tensor parallelism "
            "combined with data parallelism is not supported yet by hf_lightning (only tensor parallelism over "
            f"every process runs); set {other}=1 and tp_size to the world size, or tp_size=1"
        )
    if sizes["dp_replicate_size"] > 1:
        if sizes["dp_shard_size"] == 1:
            return (
                f"parallelism_config.dp_replicate_size={sizes['dp_replicate_size']} with dp_shard_size=1 is "
                "invalid (as in accelerate); for plain data parallelism leave every size at 1 (DDP)"
            )
        return (
            f"parallelism_config.dp_replicate_size={sizes['dp_replicate_size']}: hybrid sharding (HSDP) is not "
            "supported yet by hf_lightning (Lightning's ModelParallelStrategy has one data-parallel dimension); "
            "set dp_replicate_size=1 and dp_shard_size to the world size"
        )
    total = 1
    for size in sizes.values():
        total *= size
    if total != world_size:
        product = " x ".join(f"{name}={sizes[name]}" for name in SIZE_FIELDS)
        return (
            f"parallelism_config: {product} = {total} processes, but the launch has world_size={world_size}; "
            "make the sizes multiply to the number of processes (torchrun --nnodes x --nproc_per_node)"
        )
    return None


def mesh_description(sizes: Mapping[str, int], world_size: int) -> str:
    """How each size maps onto Lightning's device mesh, for explain()."""
    if all(size == 1 for size in sizes.values()):
        return "every size 1: no parallelism config (plain data parallelism, as in the reference)"
    if sizes["tp_size"] > 1:
        return (
            f"ModelParallelStrategy mesh over {world_size} processes: data_parallel=1 (one replica: every rank "
            f"gets the same batches), tensor_parallel={sizes['tp_size']} (tp_size: the model's tp plan, "
            "colwise / rowwise DTensor shards of its linear layers)"
        )
    return (
        f"ModelParallelStrategy mesh over {world_size} processes: data_parallel={sizes['dp_shard_size']} "
        f"(dp_shard_size: FSDP2 fully_shard on that dimension), tensor_parallel={sizes['tp_size']} (tp_size); "
        f"dp_replicate_size={sizes['dp_replicate_size']}, cp_size={sizes['cp_size']}, "
        f"sp_size={sizes['sp_size']} add no dimension"
    )
