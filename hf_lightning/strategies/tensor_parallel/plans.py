"""The tensor-parallel plan of a transformers model: transformers' own (`config.base_model_tp_plan` and the
class's `_tp_plan`, as `from_pretrained(tp_plan="auto")` resolves them), and why a model cannot be split by it."""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["SPLIT_BY_THE_TRAINER", "resolved_tp_plan", "tp_model_refusal"]

# Set on a model the tensor-parallel strategy split (not transformers at load), which a later Trainer may take again.
SPLIT_BY_THE_TRAINER = "_hf_lightning_split_by_the_trainer"


def _declared_plan(model: nn.Module) -> dict[str, str]:
    """The model's declared plan with `*` layer wildcards (empty when it has none)."""
    plan = getattr(model, "tp_plan", None)
    if plan is None:
        plan = getattr(model, "_tp_plan", None)
    return dict(plan or {})


def _head_counts(model: nn.Module) -> dict[str, int]:
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    counts = {}
    for name in ("num_attention_heads", "num_key_value_heads"):
        value = getattr(text_config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            counts[name] = value
    return counts


def tp_model_refusal(model: nn.Module | None, tp_size: int) -> str | None:
    """Why `model` cannot be split over `tp_size` ranks (naming `parallelism_config.tp_size`), or why a model
    split at load needs tp_size set; None if the run can go on."""
    split_at_load = getattr(model, "_tp_size", None)
    if tp_size <= 1:
        if isinstance(split_at_load, int) and split_at_load > 1:
            return (
                f"the model was split over {split_at_load} tensor-parallel ranks when it was loaded "
                "(from_pretrained tp_plan / distributed_config), but parallelism_config.tp_size is not set; pass "
                f"parallelism_config=ParallelismConfig(tp_size={split_at_load}), or load the model without tp_plan"
            )
        return None
    if model is None:
        return None
    field = f"parallelism_config.tp_size={tp_size}"
    if isinstance(split_at_load, int) and split_at_load > 1 and getattr(model, SPLIT_BY_THE_TRAINER, False):
        if split_at_load != tp_size:
            return f"{field}, but the model was split over {split_at_load} ranks by an earlier run; make them equal"
    elif isinstance(split_at_load, int) and split_at_load > 1:
        # Such a model keeps transformers' own mesh, and its save_pretrained waits at a barrier that only the
        # saving rank would reach: the Trainer splits the model itself instead.
        return (
            f"{field}, but the model was already split over {split_at_load} ranks when it was loaded "
            "(from_pretrained tp_plan / distributed_config); load it without tp_plan: the Trainer applies the "
            "model's tensor-parallel plan itself"
        )
    if not callable(getattr(model, "_resolve_parallel_plans", None)) or not _declared_plan(model):
        return (
            f"{field}: {type(model).__name__} has no tensor-parallel plan (transformers defines one as the config's "
            "`base_model_tp_plan` for models such as Llama, Qwen2, Mistral, Gemma); use such a model, set "
            "`model.tp_plan` to a {module name: style} dict, or set tp_size=1"
        )
    for name, count in _head_counts(model).items():
        if count % tp_size:
            return (
                f"{field}: the model's config.{name}={count} does not divide by tp_size, so the attention heads "
                "cannot be split evenly over the tensor-parallel ranks; pick a tp_size that divides it"
            )
    return None


def resolved_tp_plan(model: nn.Module, tp_size: int) -> dict[str, str]:
    """The plan with one entry per concrete module / parameter name (transformers' `_resolve_parallel_plans`)."""
    from transformers.distributed.configuration_utils import DistributedConfig

    config: Any = DistributedConfig(tp_size=tp_size)
    tp_plan, _, _ = model._resolve_parallel_plans(config)
    # A tied output embedding's weight is the input embedding's (sharded by that entry): its own name is no
    # parameter of the model, only its module keeps its forward style.
    names = {name for name, _ in model.named_modules()} | {name for name, _ in model.named_parameters()}
    return {name: style for name, style in tp_plan.items() if name in names}
