"""What evaluation must know of the strategy, so `evaluation/` never asks which one runs: whether the forward
autocasts, how many processes evaluate different samples, what `evaluate()` refuses before `train()`, and the dtype
DeepSpeed's engine takes its inputs in."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from hf_lightning.core.autocast import planned_autocast_dtype
from hf_lightning.strategies.deepspeed.steps import deepspeed_input_dtype
from hf_lightning.strategies.fsdp.policies import is_fsdp2_model
from hf_lightning.strategies.tensor_parallel.shards import trainer_tp_size

if TYPE_CHECKING:
    from hf_lightning.strategies.ports import ProcessLayout


def _uses_deepspeed(plan: Any) -> bool:
    return plan.strategy is not None and plan.strategy.name == "deepspeed"


def evaluation_autocast_dtype(plan: Any, model: Any) -> torch.dtype | None:
    """The autocast dtype of `fp16` / `bf16` mixed precision (the reference autocasts the forward), else None.

    None under DeepSpeed: the engine holds the model in its dtype and accelerate does not autocast its forward;
    `_prepare_input` casts float inputs to that dtype instead, as the reference does. None for a model FSDP2
    sharded (in training): its mixed precision is the sharding's `MixedPrecisionPolicy`, and accelerate prepares
    FSDP2 models without a forward autocast. An unsharded model (evaluate before train) keeps the autocast: the
    reference shards it with that policy for evaluation, which also computes in low precision.
    """
    if _uses_deepspeed(plan) or is_fsdp2_model(model):
        return None
    return planned_autocast_dtype(plan.module)


def evaluation_replicas(trainer: ProcessLayout) -> int:
    """The processes that evaluate different samples: all of them, except that the tensor-parallel ranks of a
    replica see the same batches."""
    return max(1, trainer.args.world_size // trainer_tp_size(trainer))


def check_evaluation_before_training(plan: Any, args: Any, engine: Any) -> None:
    """evaluate / predict under DeepSpeed before any `train()` built the engine (`engine`, the trainer's
    `deepspeed`, is None).

    The reference then builds a ZeRO inference engine (`deepspeed_init(inference=True)`), which it refuses below
    ZeRO-3. hf_lightning builds no inference engine: at ZeRO-3 the plain model gives the engine's results only
    when the config keeps float32 (the engine would cast the model to bf16 / fp16), so a 16-bit config is refused.
    """
    if not _uses_deepspeed(plan) or engine is not None:
        return
    stage = plan.strategy.deepspeed.zero_stage
    if stage != 3:
        raise ValueError(
            "ZeRO inference only makes sense with ZeRO Stage 3 - please adjust your config "
            f"(evaluate() / predict() before train() with deepspeed zero_optimization.stage={stage}: the "
            "reference refuses it too; call train() first, or evaluate with a ZeRO-3 config or without deepspeed)"
        )
    dtype = deepspeed_input_dtype(args)
    if dtype != torch.float32:
        raise ValueError(
            f"evaluate() / predict() before train() under DeepSpeed ZeRO-3 with a {dtype} config "
            f"({'bf16' if dtype == torch.bfloat16 else 'fp16'}.enabled=true): the reference evaluates a "
            "ZeRO inference engine holding the model in that dtype, which hf_lightning does not build yet. Call "
            "train() first, evaluate with the 16-bit section disabled, or evaluate without deepspeed."
        )


def tensor_parallel_size(trainer: ProcessLayout) -> int:
    """The processes one replica's model is split over: 1 unless the run is tensor parallel."""
    return trainer_tp_size(trainer)
