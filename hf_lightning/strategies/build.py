"""What the plan's strategy is built into: the `strategy=` value for `lightning.Trainer`, its checkpoint I/O and
its steps (clipping, the learning rate, the engine's questions)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hf_lightning.strategies.checkpoint_io import StrategyCheckpointIO
from hf_lightning.strategies.deepspeed.checkpoint_io import DeepSpeedCheckpointIO
from hf_lightning.strategies.deepspeed.steps import DeepSpeedSteps
from hf_lightning.strategies.fsdp.checkpoint import FSDPCheckpointIO
from hf_lightning.strategies.fsdp.policies import FSDP_STRATEGY_NAMES, is_fsdp_plan
from hf_lightning.strategies.fsdp.steps import FSDPSteps
from hf_lightning.strategies.process_group_options import process_group_kwargs
from hf_lightning.strategies.steps import StrategySteps
from hf_lightning.strategies.tensor_parallel.checkpoint_io import TensorParallelCheckpointIO
from hf_lightning.strategies.tensor_parallel.steps import TensorParallelSteps

if TYPE_CHECKING:
    from hf_lightning.translation.plan import Plan


def resolve_ddp_kwargs(plan: Plan, model: Any) -> dict[str, Any]:
    """`DDPStrategy` kwargs with the model-dependent `find_unused_parameters` default filled in."""
    strategy = plan.strategy
    if strategy is None or strategy.name != "ddp":
        raise ValueError("the plan does not use DDP")
    kwargs = process_group_kwargs(strategy)
    # DDP's own options are passed only when set, so DDP's defaults apply otherwise (as in the reference).
    options = {
        "bucket_cap_mb": strategy.bucket_cap_mb,
        "broadcast_buffers": strategy.broadcast_buffers,
        "static_graph": strategy.static_graph,
    }
    kwargs.update({name: value for name, value in options.items() if value is not None})
    if strategy.find_unused_parameters is not None:
        kwargs["find_unused_parameters"] = strategy.find_unused_parameters
    elif any(cls.__name__ == "PreTrainedModel" for cls in type(model).__mro__):
        # Duck-typed so transformers stays optional: a PreTrainedModel anywhere in the MRO.
        checkpointing = getattr(model, "is_activation_checkpointing", None)
        if checkpointing is None:  # transformers before the v5 rename
            checkpointing = getattr(model, "is_gradient_checkpointing", False)
        kwargs["find_unused_parameters"] = not (bool(checkpointing) or plan.module.activation_checkpointing)
    else:
        kwargs["find_unused_parameters"] = True
    return kwargs


def build_strategy(plan: Plan, model: Any) -> Any:
    """The `strategy=` value for `lightning.Trainer`: "auto" or a Lightning strategy object."""
    if plan.strategy is None:
        return "auto"
    name = plan.strategy.name
    if name == "ddp":
        # lazy: only the planned strategy's Lightning classes load
        from hf_lightning.strategies.ddp import MicroBatchDDPStrategy

        return MicroBatchDDPStrategy(**resolve_ddp_kwargs(plan, model))
    if name in ("fsdp", "fsdp2"):
        # lazy: only the planned strategy's Lightning classes load
        from hf_lightning.strategies.fsdp.strategy import build_fsdp_strategy

        return build_fsdp_strategy(plan, model)
    if name == "tp":
        # lazy: only the planned strategy's Lightning classes load
        from hf_lightning.strategies.tensor_parallel.strategy import build_tp_strategy

        return build_tp_strategy(plan)
    if name == "deepspeed":
        # lazy: Lightning's DeepSpeed strategy (and Lightning) load only when DeepSpeed runs
        from hf_lightning.strategies.deepspeed.strategy import build_deepspeed_strategy

        return build_deepspeed_strategy(plan, model)
    raise NotImplementedError(f"building the {name!r} strategy lands with its feature")


def checkpoint_io_for(plan: Plan) -> StrategyCheckpointIO:
    """How the plan's strategy writes and reads its checkpoint files: DeepSpeed's engine, FSDP's files, a
    tensor-parallel model's gathered files, or the plain files of one process / DDP."""
    name = plan.strategy.name if plan.strategy is not None else None
    if name == "deepspeed":
        return DeepSpeedCheckpointIO()
    if is_fsdp_plan(plan):
        return FSDPCheckpointIO()
    if name == "tp":
        return TensorParallelCheckpointIO()
    return StrategyCheckpointIO()


# Stateless, so one each; DeepSpeed's carries the plan's ZeRO stage.
_STEPS: dict[str | None, StrategySteps] = {
    None: StrategySteps(),
    "ddp": StrategySteps(),
    "tp": TensorParallelSteps(),
    **{name: FSDPSteps() for name in FSDP_STRATEGY_NAMES},
}


def steps_for(plan: Plan) -> StrategySteps:
    """What the plan's strategy does at each update and answers the engine (strategies/steps.py): clipping, the
    learning rate, the inputs' dtype, generation's process sync, who places the model."""
    strategy = plan.strategy
    if strategy is None:
        return _STEPS[None]
    if strategy.name == "deepspeed":
        return DeepSpeedSteps(None if strategy.deepspeed is None else strategy.deepspeed.zero_stage)
    return _STEPS.get(strategy.name, _STEPS[None])
