"""Optimizer names -> classes and kwargs, parameter groups and `optim_args` (R5.1-R5.3).

Mirrors `transformers.trainer_optimizer` and `Trainer.create_optimizer` without importing transformers.
Optimizers from optional packages are built like the reference when the package is importable; otherwise
`MissingOptimizerPackageError` (a ValueError and an ImportError) names the `optim` value and the pip command.
"""

from __future__ import annotations

import logging
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from hf_lightning.core.enums import enum_value
from hf_lightning.optim.adafactor import Adafactor
from hf_lightning.optim.context import OptimizerContext

# The optional-package handlers and the GaLore/APOLLO setup live in extras.py.
from hf_lightning.optim.extras import (
    _get_adamw_anyprecision,
    _get_adamw_torch_npu_fused,
    _get_adamw_torch_xla,
    _get_apollo_optimizer,
    _get_bitsandbytes_optimizer,
    _get_galore_optimizer,
    _get_grokadamw,
    _get_lomo_optimizer,
    _get_schedule_free_optimizer,
    _get_stable_adamw,
    _get_torchao_optimizer,
)

logger = logging.getLogger(__name__)

# The reference's decay exclusion patterns, matched against lower-cased dotted names (R5.2).
FORBIDDEN_NAME_PATTERNS = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]


def parse_optim_args(optim_args: str | None) -> dict[str, str]:
    """Parse `optim_args` ("k1=v1, k2=v2"): spaces removed, values kept as strings (R5.3)."""
    if not optim_args:
        return {}
    parsed = {}
    for item in optim_args.replace(" ", "").split(","):
        parts = item.split("=")
        if len(parts) != 2:
            raise ValueError(
                f"optim_args={optim_args!r}: item {item!r} is not of the form key=value; "
                "use comma-separated key=value pairs, e.g. 'momentum=0.9,nesterov=true'."
            )
        parsed[parts[0]] = parts[1]
    return parsed


def get_parameter_names(
    model: nn.Module, forbidden_layer_types: list[type], forbidden_layer_names: list[str] | None = None
) -> list[str]:
    """Names of the parameters not inside a forbidden layer type nor matching a forbidden pattern."""
    patterns = [re.compile(p) for p in forbidden_layer_names] if forbidden_layer_names is not None else []
    result = []
    for name, child in model.named_children():
        child_params = get_parameter_names(child, forbidden_layer_types, forbidden_layer_names)
        result += [
            f"{name}.{n}"
            for n in child_params
            if not isinstance(child, tuple(forbidden_layer_types))
            and not any(p.search(f"{name}.{n}".lower()) for p in patterns)
        ]
    # Parameters registered directly on this module.
    result += [k for k in model._parameters if not any(p.search(k.lower()) for p in patterns)]
    return result


def get_decay_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters that get weight decay: not in an `nn.LayerNorm`, not bias/norm-like (R5.2)."""
    return get_parameter_names(model, [nn.LayerNorm], FORBIDDEN_NAME_PATTERNS)


def build_parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay group (`weight_decay`) then no-decay group (0.0), trainable parameters in `named_parameters` order."""
    decay_parameters = set(get_decay_parameter_names(model))
    named = list(model.named_parameters())
    return [
        {
            "params": [p for n, p in named if n in decay_parameters and p.requires_grad],
            "weight_decay": weight_decay,
        },
        {
            "params": [p for n, p in named if n not in decay_parameters and p.requires_grad],
            "weight_decay": 0.0,
        },
    ]


def _split_groups_by_device_mesh(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Parameters on different DTensor meshes (expert parallelism, 2-D meshes) cannot share one
    # fused/foreach kernel call, so each mesh gets its own group, as in the reference.
    dtensor_module = sys.modules.get("torch.distributed.tensor")
    if dtensor_module is None:  # never imported, so no parameter can be a DTensor
        return groups
    DTensor = dtensor_module.DTensor

    def mesh(p: torch.Tensor) -> Any:
        return p.device_mesh if isinstance(p, DTensor) else None

    if len({mesh(p) for g in groups for p in g["params"]}) <= 1:
        return groups
    split = []
    for group in groups:
        by_mesh: dict[Any, list] = defaultdict(list)
        for p in group["params"]:
            by_mesh[mesh(p)].append(p)
        split.extend({**group, "params": params} for params in by_mesh.values())
    return split


# ---------------------------------------------------------------------------------------------
# Handlers: one per optim family, each returning (class or factory, kwargs)
# ---------------------------------------------------------------------------------------------


def _get_adafactor(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    ctx.optimizer_kwargs.update({"scale_parameter": False, "relative_step": False})
    return Adafactor, ctx.optimizer_kwargs


def _get_adamw_torch(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    ctx.optimizer_kwargs.update(ctx.adam_kwargs)
    if ctx.optim == "adamw_torch_fused":
        ctx.optimizer_kwargs.update({"fused": True})
    return torch.optim.AdamW, ctx.optimizer_kwargs


def _float_keys(kwargs: dict[str, Any], optim_args: dict[str, str], keys: Iterable[str]) -> None:
    for key in keys:
        if key in optim_args:
            kwargs[key] = float(optim_args[key])


def _get_sgd(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    kwargs = ctx.optimizer_kwargs.copy()
    _float_keys(kwargs, ctx.optim_args, ("momentum", "dampening", "weight_decay"))
    if "nesterov" in ctx.optim_args:
        kwargs["nesterov"] = ctx.optim_args["nesterov"].lower() in ("true", "1", "yes")
    return torch.optim.SGD, kwargs


def _get_adagrad(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    kwargs = ctx.optimizer_kwargs.copy()
    _float_keys(kwargs, ctx.optim_args, ("lr_decay", "weight_decay", "eps"))
    return torch.optim.Adagrad, kwargs


def _get_rmsprop(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    kwargs = ctx.optimizer_kwargs.copy()
    _float_keys(kwargs, ctx.optim_args, ("momentum", "alpha", "eps", "weight_decay"))
    if "centered" in ctx.optim_args:
        kwargs["centered"] = ctx.optim_args["centered"].lower() in ("true", "1", "yes")
    return torch.optim.RMSprop, kwargs


_BNB = [
    "adamw_bnb_8bit", "adamw_8bit", "paged_adamw_32bit", "paged_adamw_8bit", "ademamix", "ademamix_8bit",
    "paged_ademamix_32bit", "paged_ademamix_8bit", "lion_32bit", "lion_8bit", "paged_lion_32bit",
    "paged_lion_8bit", "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit",
]  # fmt: skip
_GALORE = ["galore_adamw", "galore_adamw_8bit", "galore_adafactor"]
_GALORE += [name + "_layerwise" for name in _GALORE]

# Every OptimizerNames value of the reference -> handler.
OPTIMIZER_HANDLERS: dict[str, Callable[[OptimizerContext], tuple[Any, dict[str, Any]]]] = {
    "adafactor": _get_adafactor,
    "adamw_torch": _get_adamw_torch,
    "adamw_torch_fused": _get_adamw_torch,
    "adamw_torch_xla": _get_adamw_torch_xla,
    "adamw_torch_npu_fused": _get_adamw_torch_npu_fused,
    "adamw_anyprecision": _get_adamw_anyprecision,
    "sgd": _get_sgd,
    "adagrad": _get_adagrad,
    "rmsprop": _get_rmsprop,
    "grokadamw": _get_grokadamw,
    "stable_adamw": _get_stable_adamw,
    "lomo": _get_lomo_optimizer,
    "adalomo": _get_lomo_optimizer,
    **dict.fromkeys(_BNB, _get_bitsandbytes_optimizer),
    **dict.fromkeys(_GALORE, _get_galore_optimizer),
    **dict.fromkeys(["apollo_adamw", "apollo_adamw_layerwise"], _get_apollo_optimizer),
    **dict.fromkeys(["adamw_torch_4bit", "adamw_torch_8bit"], _get_torchao_optimizer),
    **dict.fromkeys(
        ["schedule_free_radam", "schedule_free_adamw", "schedule_free_sgd"], _get_schedule_free_optimizer
    ),
}


def get_optimizer_cls_and_kwargs(args: Any, model: nn.Module | None = None) -> tuple[Any, dict[str, Any]]:
    """`(optimizer class or factory, kwargs)` for `args.optim`, as `Trainer.get_optimizer_cls_and_kwargs`.

    Weight decay is not in the kwargs (it lives in the parameter groups), except where the reference
    puts it there (schedule-free, stable_adamw, or `optim_args`), and the groups' value still wins.
    """
    optim = enum_value(args.optim)
    handler = OPTIMIZER_HANDLERS.get(optim)
    if handler is None:
        raise ValueError(
            f"optim={optim!r} is not a supported optimizer; choose one of {sorted(OPTIMIZER_HANDLERS)}."
        )
    ctx = OptimizerContext(
        args=args,
        model=model,
        optim=optim,
        optimizer_kwargs={"lr": args.learning_rate},
        adam_kwargs={"betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon},
        optim_args=parse_optim_args(args.optim_args),
    )
    return handler(ctx)


def is_optimizer_factory(optimizer_cls_or_factory: Any) -> bool:
    """True unless the value is a `torch.optim.Optimizer` subclass (R5.1: other callables are factories)."""
    return not (
        isinstance(optimizer_cls_or_factory, type)
        and issubclass(optimizer_cls_or_factory, torch.optim.Optimizer)
    )


def instantiate_optimizer(
    optimizer_cls: Any, optimizer_kwargs: dict[str, Any], param_groups: list[dict[str, Any]], model: nn.Module
) -> torch.optim.Optimizer:
    """Construct the optimizer from (class or factory, kwargs) and the parameter groups, as the
    reference's `Trainer.create_optimizer` does after choosing them (R5.1)."""
    # A copy, so a user's `optimizer_cls_and_kwargs` dict is reusable at the next train().
    optimizer_kwargs = dict(optimizer_kwargs)
    if is_optimizer_factory(optimizer_cls):
        # Factories (e.g. Muon/Dion-style) split the model's parameters themselves.
        return optimizer_cls()(model, **optimizer_kwargs)

    # Handlers that build their own groups (GaLore/APOLLO), take the model (LOMO) or are
    # layer-wise pass them through these keys; the last one present wins, as in the reference.
    params: Any = _split_groups_by_device_mesh(param_groups)
    for key in ("params", "model", "optimizer_dict"):
        if key in optimizer_kwargs:
            params = optimizer_kwargs.pop(key)
    optimizer = optimizer_cls(params, **optimizer_kwargs)

    if "bitsandbytes" in str(optimizer_cls) and optimizer_kwargs.get("optim_bits", None) == 8:
        import bitsandbytes

        # 8-bit states for embeddings hurt quality: keep them in 32 bits, as the reference does.
        manager = bitsandbytes.optim.GlobalOptimManager.get_instance()
        for module in model.modules():
            if isinstance(module, nn.Embedding):
                manager.register_module_override(module, "weight", {"optim_bits": 32})
                logger.debug(f"bitsandbytes: will optimize {module} in fp32")
    return optimizer


def create_optimizer(
    model: nn.Module, args: Any, optimizer_cls_and_kwargs: tuple[Any, dict[str, Any]] | None = None
) -> torch.optim.Optimizer:
    """Build the optimizer as the reference's default `Trainer.create_optimizer` does (R5.1, R5.2)."""
    groups = build_parameter_groups(model, args.weight_decay)
    if optimizer_cls_and_kwargs is not None:
        optimizer_cls, optimizer_kwargs = optimizer_cls_and_kwargs
    else:
        optimizer_cls, optimizer_kwargs = get_optimizer_cls_and_kwargs(args, model)
    return instantiate_optimizer(optimizer_cls, optimizer_kwargs, groups, model)
