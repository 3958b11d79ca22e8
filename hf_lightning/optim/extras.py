"""Optimizers from optional packages, and the GaLore/APOLLO parameter-group setup (R5.1).

The handlers behind `optim.OPTIMIZER_HANDLERS` for bitsandbytes, torchao, GaLore, APOLLO, LOMO, GrokAdamW,
schedule-free, optimi, torchdistx, torch_xla and torch_npu: each checks its package (`ctx.require`, which
raises `MissingOptimizerPackageError` naming the pip command), imports it lazily and returns
`(class, kwargs)` exactly as the reference's `transformers.trainer_optimizer` does.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hf_lightning.args.truth import str_to_bool
from hf_lightning.core.enums import enum_value
from hf_lightning.optim.context import OptimizerContext

logger = logging.getLogger(__name__)


class LayerWiseDummyOptimizer(torch.optim.Optimizer):
    """No-op optimizer for layer-wise GaLore/APOLLO: the real per-parameter optimizers step from gradient hooks."""

    def __init__(self, optimizer_dict: dict | None = None, **kwargs: Any) -> None:
        dummy_tensor = torch.randn(1, 1)
        self.optimizer_dict = optimizer_dict
        super().__init__([dummy_tensor], {"lr": kwargs.get("lr", 1e-03)})

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def step(self, closure: Callable | None = None) -> float | None:
        pass


def _get_adamw_torch_xla(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    ctx.require("torch_xla", "pip install torch-xla")
    from torch_xla.amp.syncfree import AdamW

    ctx.optimizer_kwargs.update(ctx.adam_kwargs)
    return AdamW, ctx.optimizer_kwargs


def _get_adamw_torch_npu_fused(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    ctx.require("torch_npu", "pip install torch-npu")
    from torch_npu.optim import NpuFusedAdamW

    ctx.optimizer_kwargs.update(ctx.adam_kwargs)
    return NpuFusedAdamW, ctx.optimizer_kwargs


def _get_adamw_anyprecision(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    # torchdistx is not on PyPI: it installs from its repository.
    ctx.require("torchdistx", "pip install git+https://github.com/pytorch/torchdistx")
    from torchdistx.optimizers import AnyPrecisionAdamW

    ctx.optimizer_kwargs.update(ctx.adam_kwargs)
    oa = ctx.optim_args
    ctx.optimizer_kwargs.update(
        {
            "use_kahan_summation": str_to_bool(oa.get("use_kahan_summation", "False")),
            "momentum_dtype": getattr(torch, oa.get("momentum_dtype", "float32")),
            "variance_dtype": getattr(torch, oa.get("variance_dtype", "float32")),
            "compensation_buffer_dtype": getattr(torch, oa.get("compensation_buffer_dtype", "bfloat16")),
        }
    )
    return AnyPrecisionAdamW, ctx.optimizer_kwargs


def _get_bitsandbytes_optimizer(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    ctx.require("bitsandbytes", "pip install 'bitsandbytes>=0.46.1'", "0.46.1")
    from bitsandbytes.optim import AdamW, Lion, RMSprop

    name, args, oa = ctx.optim, ctx.args, ctx.optim_args
    optimizer_cls: Any = None
    additional = ctx.adam_kwargs
    if "adam" in name:
        optimizer_cls = AdamW
    elif "lion" in name:
        optimizer_cls = Lion
        additional = {"betas": (args.adam_beta1, args.adam_beta2)}
    elif "rmsprop" in name:
        optimizer_cls = RMSprop
        additional = oa  # raw strings, passed through as in the reference
    elif "ademamix" in name:
        from bitsandbytes.optim import AdEMAMix

        optimizer_cls = AdEMAMix
        additional = {
            "betas": (
                float(oa.get("beta1", args.adam_beta1)),
                float(oa.get("beta2", args.adam_beta2)),
                float(oa.get("beta3", 0.9999)),
            ),
            "alpha": float(oa.get("alpha", 5.0)),
            "eps": float(oa.get("eps", args.adam_epsilon)),
        }
        for key in ("t_alpha", "t_beta3"):
            if key in oa:
                additional[key] = int(oa[key])
    bnb_kwargs: dict[str, Any] = {"optim_bits": 8 if "8bit" in name else 32}
    if "rmsprop" not in name:
        bnb_kwargs["is_paged"] = "paged" in name
    ctx.optimizer_kwargs.update(additional)
    ctx.optimizer_kwargs.update(bnb_kwargs)
    return optimizer_cls, ctx.optimizer_kwargs


def _get_torchao_optimizer(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    # The reference checks torchao through is_torchao_available(), whose default floor is 0.15.0.
    ctx.require("torchao", "pip install 'torchao>=0.15.0'", "0.15.0")
    from torchao.optim import AdamW4bit, AdamW8bit

    optimizer_cls = AdamW4bit if ctx.optim == "adamw_torch_4bit" else AdamW8bit
    ctx.optimizer_kwargs.update(
        {
            "block_size": ctx.optim_args.get("block_size", 256),
            "bf16_stochastic_round": str_to_bool(ctx.optim_args.get("bf16_stochastic_round", "False")),
        }
    )
    ctx.optimizer_kwargs.update(ctx.adam_kwargs)
    return optimizer_cls, ctx.optimizer_kwargs


def _get_grokadamw(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    ctx.require("grokadamw", "pip install grokadamw")
    from grokadamw import GrokAdamW

    defaults = {"alpha_init": 0.98, "lamb": 2.0, "gamma": 0.1, "grokking_signal_decay_rate": 0.1}
    defaults["gradient_clipping"] = 1.0
    ctx.optimizer_kwargs.update({k: float(ctx.optim_args.get(k, d)) for k, d in defaults.items()})
    return GrokAdamW, ctx.optimizer_kwargs


def _get_schedule_free_optimizer(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    # RAdamScheduleFree appeared in schedulefree 1.4.0.
    floor = "1.4.0" if ctx.optim == "schedule_free_radam" else "1.2.6"
    ctx.require("schedulefree", f"pip install 'schedulefree>={floor}'", floor)
    from schedulefree import AdamWScheduleFree, SGDScheduleFree

    additional: dict[str, Any] = {}
    require_warmup = True
    if ctx.optim == "schedule_free_radam":
        from schedulefree import RAdamScheduleFree

        optimizer_cls: Any = RAdamScheduleFree
        additional = ctx.adam_kwargs
        require_warmup = False
    elif ctx.optim == "schedule_free_adamw":
        optimizer_cls = AdamWScheduleFree
        additional = ctx.adam_kwargs
    else:
        optimizer_cls = SGDScheduleFree
    additional["weight_decay"] = ctx.args.weight_decay
    if require_warmup:
        additional["warmup_steps"] = ctx.args.warmup_steps
    additional["weight_lr_power"] = float(ctx.optim_args.get("weight_lr_power", 2.0))
    additional["r"] = float(ctx.optim_args.get("r", 0.0))
    ctx.optimizer_kwargs.update(additional)
    return optimizer_cls, ctx.optimizer_kwargs


def _get_stable_adamw(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    ctx.require("optimi", "pip install torch-optimi")
    from optimi import StableAdamW

    max_lr = ctx.optim_args.pop("max_lr", None)
    kahan_sum = ctx.optim_args.pop("kahan_sum", None)
    ctx.adam_kwargs["weight_decay"] = ctx.args.weight_decay
    ctx.optimizer_kwargs.update(ctx.adam_kwargs)
    ctx.optimizer_kwargs.update(
        {
            # bool() of a non-empty string is True, as in the reference.
            "decouple_lr": bool(ctx.optim_args.pop("decouple_lr", False)),
            "max_lr": float(max_lr) if max_lr is not None else None,
            "kahan_sum": bool(kahan_sum) if kahan_sum is not None else None,
        }
    )
    return StableAdamW, ctx.optimizer_kwargs


def _get_lomo_optimizer(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    ctx.require("lomo_optim", "pip install lomo-optim")
    if ctx.model is None:
        raise ValueError("You need to pass a `model` in order to correctly initialize a LOMO optimizer.")
    from lomo_optim import AdaLomo, Lomo

    ctx.optimizer_kwargs.update({"model": ctx.model})
    return (AdaLomo if "ada" in ctx.optim else Lomo), ctx.optimizer_kwargs


def check_target_module_exists(optim_target_modules: str | list[str], key: str) -> tuple[bool, bool]:
    """Whether module `key` matches `optim_target_modules`, and whether the match was a regex."""
    if isinstance(optim_target_modules, str):
        return bool(re.fullmatch(optim_target_modules, key)), optim_target_modules != key
    if key in optim_target_modules or any(t in key for t in optim_target_modules):
        return True, False
    if any(re.fullmatch(t, key) for t in optim_target_modules):
        return True, True
    return False, False


def setup_low_rank_optimizer(
    args: Any,
    model: nn.Module | None,
    optim: str,
    optimizer_cls: Any,
    optim_kwargs: dict,
    optimizer_kwargs: dict,
) -> tuple[Any, dict[str, Any]]:
    """GaLore/APOLLO groups: non-target params, then target `nn.Linear` weights with `optim_kwargs`;
    `_layerwise` names get one optimizer per parameter stepped from gradient hooks."""
    is_layerwise = optim.lower().endswith("layerwise")
    parallel_mode = enum_value(getattr(args, "parallel_mode", None))
    if is_layerwise and parallel_mode == "distributed":
        raise NotImplementedError(f"Layer-wise {optim} does not support DDP at this time")
    targets = args.optim_target_modules
    if targets is None:
        raise ValueError(f"You need to define `optim_target_modules` to use {optim} optimizers")
    if not isinstance(targets, (list, str)):
        raise TypeError(
            f"`optim_target_modules` must be a list of strings, a regex string, or 'all-linear'. Got: {targets}"
        )
    if model is None:
        raise ValueError(f"You need to pass a model to initialize {optim} optimizer.")
    all_linear = isinstance(targets, str) and targets.replace("_", "-") == "all-linear"

    target_names = []
    for module_name, module in model.named_modules():
        found, is_regex = check_target_module_exists(targets, module_name)
        if not isinstance(module, nn.Linear):
            if found and not is_regex:
                logger.warning(f"{module_name} matched but ignored. {optim} only supports linear layers.")
            continue
        if found or all_linear:
            target_names.append(module_name + ".weight")
    if not target_names:
        raise ValueError(f"No target modules found for {optim} ({targets}).")

    target_params = [p for n, p in model.named_parameters() if n in target_names]
    non_target_params = [p for n, p in model.named_parameters() if n not in target_names]
    param_groups = [{"params": non_target_params}, {"params": target_params, **optim_kwargs}]

    if is_layerwise:
        if args.gradient_accumulation_steps != 1:
            raise ValueError(f"Layerwise {optim} does not support gradient accumulation!")
        optimizer_dict = {p: optimizer_cls([{"params": [p]}], **optimizer_kwargs) for p in non_target_params}
        for p in target_params:
            optimizer_dict[p] = optimizer_cls([{"params": [p], **optim_kwargs}], **optimizer_kwargs)

        def optimizer_hook(param: torch.Tensor) -> None:
            if param.grad is not None:
                optimizer_dict[param].step()
                optimizer_dict[param].zero_grad()

        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(optimizer_hook)
        optimizer_cls = LayerWiseDummyOptimizer
        optimizer_kwargs.update({"optimizer_dict": optimizer_dict})

    optimizer_kwargs.update({"params": param_groups})
    return optimizer_cls, optimizer_kwargs


def _get_galore_optimizer(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    ctx.require("galore_torch", "pip install galore-torch")
    from galore_torch import GaLoreAdafactor, GaLoreAdamW, GaLoreAdamW8bit

    base = ctx.optim.removesuffix("_layerwise")
    cls = {
        "galore_adamw": GaLoreAdamW,
        "galore_adamw_8bit": GaLoreAdamW8bit,
        "galore_adafactor": GaLoreAdafactor,
    }
    oa = ctx.optim_args
    galore_kwargs = {
        "rank": int(oa.pop("rank", 128)),
        "update_proj_gap": int(oa.pop("update_proj_gap", 200)),
        "scale": float(oa.pop("scale", 0.25)),
        "proj_type": oa.pop("proj_type", "std"),
    }
    optimizer_cls, kwargs = setup_low_rank_optimizer(
        ctx.args, ctx.model, ctx.optim, cls[base], galore_kwargs, ctx.optimizer_kwargs
    )
    if ctx.optim == "galore_adafactor":
        # Only the non-layer-wise name, as in the reference.
        kwargs.update({"scale_parameter": False, "relative_step": False})
    return optimizer_cls, kwargs


def _get_apollo_optimizer(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    ctx.require("apollo_torch", "pip install apollo-torch")
    from apollo_torch import APOLLOAdamW

    oa = ctx.optim_args
    apollo_kwargs = {
        "rank": int(oa.pop("rank", 128)),
        "proj": oa.pop("proj", "random"),
        "scale_type": oa.pop("scale_type", "channel"),
        "update_proj_gap": int(oa.pop("update_proj_gap", 200)),
        "scale": float(oa.pop("scale", 1.0)),
        "proj_type": oa.pop("proj_type", "std"),
        **ctx.adam_kwargs,
    }
    return setup_low_rank_optimizer(
        ctx.args, ctx.model, ctx.optim, APOLLOAdamW, apollo_kwargs, ctx.optimizer_kwargs
    )
