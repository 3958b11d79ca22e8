"""`HFTensorParallelStrategy`: Lightning's `ModelParallelStrategy` (its mesh `data_parallel` x `tensor_parallel`)
that splits the user's transformers model with the model's own tensor-parallel plan, as
`from_pretrained(tp_plan="auto")` does for the reference, in `HFLightningModule.configure_model`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn

from hf_lightning.strategies.process_group_options import process_group_kwargs
from hf_lightning.strategies.tensor_parallel.plans import (
    SPLIT_BY_THE_TRAINER,
    resolved_tp_plan,
    tp_model_refusal,
)
from hf_lightning.strategies.tensor_parallel.shards import is_tp_sharded

if TYPE_CHECKING:
    from hf_lightning.strategies.ports import HandOverModule

__all__ = ["HFTensorParallelStrategy", "build_tp_strategy"]


class HFTensorParallelStrategy(ModelParallelStrategy):
    """Tensor parallelism over every process (one data-parallel replica): DTensor parameters on the mesh's
    `tensor_parallel` dimension, every rank fed the same batches."""

    def __init__(self, *, tensor_parallel_size: int, **kwargs: Any) -> None:
        super().__init__(data_parallel_size=1, tensor_parallel_size=tensor_parallel_size, **kwargs)
        self.tp_size = tensor_parallel_size

    def shard_user_model(self, module: HandOverModule) -> None:
        """Apply the model's plan on the `tensor_parallel` mesh (rank 0's weights on every rank first)."""
        facade = module.facade
        model = facade.model
        if not is_tp_sharded(model):  # a later train() call finds it split already
            refusal = tp_model_refusal(model, self.tp_size)
            if refusal:
                raise ValueError(refusal)
            if facade.optimizer is not None or facade.lr_scheduler is not None:
                raise RuntimeError(
                    "Passing `optimizers` is not supported with parallelism_config.tp_size > 1: the plan replaces "
                    "the parameters with DTensor shards, which an optimizer built before would not update. "
                    "Subclass `Trainer` and override `create_optimizer`, or pass `optimizer_cls_and_kwargs`."
                )
            model.to(self.root_device)
            _broadcast_rank0_states(model)
            from transformers.distributed.tensor_parallel import apply_tensor_parallelism

            tied = _tied_embeddings(model)
            mesh = self.device_mesh["tensor_parallel"]
            apply_tensor_parallelism(model, mesh, resolved_tp_plan(model, self.tp_size))
            if tied:  # the input embedding's weight became a DTensor: the output embedding shares it again
                model.get_output_embeddings().weight = model.get_input_embeddings().weight
            # What transformers sets on a model it split at load time; the reference's get_tp_size reads it.
            model._tp_size = self.tp_size
            model._device_mesh = self.device_mesh
            setattr(model, SPLIT_BY_THE_TRAINER, True)
        module.adopt_wrapped_model(model, as_model=True)


def _tied_embeddings(model: nn.Module) -> bool:
    """Whether the output embedding's weight is the input embedding's (`tie_word_embeddings`)."""
    get_input = getattr(model, "get_input_embeddings", None)
    get_output = getattr(model, "get_output_embeddings", None)
    if not (callable(get_input) and callable(get_output)):
        return False
    inputs, outputs = get_input(), get_output()
    weight = getattr(inputs, "weight", None)
    return weight is not None and weight is getattr(outputs, "weight", None)


def _broadcast_rank0_states(model: nn.Module) -> None:
    """Every rank takes rank 0's parameters and buffers, so the shards cut from them make one model (the
    reference's ranks load the same pretrained file)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)


def build_tp_strategy(plan: Any) -> HFTensorParallelStrategy:
    """The strategy of a plan whose `tensor_parallel_size` > 1."""
    strategy = plan.strategy
    return HFTensorParallelStrategy(
        tensor_parallel_size=strategy.tensor_parallel_size, **process_group_kwargs(strategy)
    )
