"""FSDP through Lightning, wrapping the model the way the reference (accelerate's FSDP plugin) does (R7.2).

This module holds the wrap policies and the helpers the training step uses; it imports no Lightning, so the
facade stays light to import. The strategies are in `hf_lightning/strategies/fsdp/strategy.py`:
`build_fsdp_strategy(plan, model)` turns the plan's FSDP plugin arguments (the reference's `fsdp_plugin_args`,
computed by `registry.distributed.fsdp_plugin_args`) into a Lightning strategy:

| fsdp_config (reference)       | version 1: `HFFSDPStrategy` (an `FSDPStrategy`)        | version 2: `HFFSDP2Strategy` (a `ModelParallelStrategy`) |
|-------------------------------|--------------------------------------------------------|----------------------------------------------------------|
| reshard_after_forward         | `sharding_strategy` (full_shard, shard_grad_op, ...)   | `fully_shard(reshard_after_forward=bool)`                |
| cpu_offload                   | `cpu_offload=CPUOffload(offload_params=True)`          | `offload_policy=CPUOffloadPolicy()`                      |
| TRANSFORMER_BASED_WRAP        | `transformer_auto_wrap_policy` over the classes named by `transformer_layer_cls_to_wrap`, else the model's `_no_split_modules` | `fully_shard` on each module of those classes, bottom-up |
| SIZE_BASED_WRAP (+ min_num_params > 0) | `size_based_auto_wrap_policy(min_num_params)` | `fully_shard` on each module above `min_num_params`    |
| NO_WRAP                       | no policy: one FSDP unit                               | the root unit only                                       |
| (always, FSDP2)               |                                                        | accelerate's extra units: input embeddings; final norm + output embeddings (`reshard_after_forward=False`) |
| activation_checkpointing      | `apply_activation_checkpointing` with the wrap policy  | `checkpoint_wrapper(preserve_rng_state=False)` on the wrapped layers, before sharding |
| state_dict_type               | `state_dict_type="full"/"sharded"`                     | `save_distributed_checkpoint`                            |
| bf16 / fp16                   | `MixedPrecision(param, reduce, buffer dtype)` plus the forward autocast | `MixedPrecisionPolicy(param, reduce, output dtype)`, no forward autocast (accelerate prepares FSDP2 models without one) |
| forward/backward_prefetch, use_orig_params, sync_module_states, limit_all_gathers | FSDP keyword arguments | (FSDP1 only)                                 |
| cpu_ram_efficient_loading     | `sync_module_states=True` (rank 0's weights broadcast) | rank 0's full state dict broadcast into the shards       |

Why subclasses: Lightning's strategies wrap the LightningModule, so FSDP's forward would run once per
`training_step` (one accumulation window), while each micro-batch needs its own forward/backward through the
wrapper (as for DDP, `hf_lightning/strategies/ddp.py`). Both strategies wrap the user's model inside the module and hand it
to the facade as `model` and `model_wrapped` (the reference too makes `trainer.model` the FSDP model). Version 1
wraps in Lightning's `_setup_model`; version 2 shards in `configure_model`, where Lightning expects it.

Mapping choices: version 2 goes to `ModelParallelStrategy` (data parallel size = world size, tensor parallel 1)
because it is Lightning's `fully_shard` strategy; its own `FSDPStrategy` is FSDP1's wrapper class.
[divergence] accelerate builds FSDP1 with its plugin's `sharding_strategy`, which defaults to FULL_SHARD (env
`FSDP_SHARDING_STRATEGY`) and overrides the `reshard_after_forward` transformers passes; hf_lightning honours the
requested strategy (the updates are the same, the memory layout is the one asked for).
[divergence] accelerate's FSDP2 preparation also shards a model's input embeddings on their own; when they sit inside
a unit already (BERT's `BertEmbeddings` is one of its `_no_split_modules`) torch refuses the second sharding, and they
stay in that unit here.

CPU: torch runs both FSDP versions on CPU with gloo. FSDP1 then needs an explicit `device_id`, which Lightning does
not pass (it also refuses its own `FSDPStrategy` on a CPU accelerator; the subclass is accepted), and its
`sync_module_states` broadcast only works from GPU memory, so on CPU the same broadcast is done before wrapping.
[divergence] The reference runs such a launch as plain DDP (accelerate ignores its FSDP plugin on CPU): same
numbers, FSDP's checkpoint files instead of DDP's.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from hf_lightning.strategies.ports import HandOverModule
    from hf_lightning.translation.plan import Plan

__all__ = [
    "FSDP_STRATEGY_NAMES",
    "fsdp1_auto_wrap_policy",
    "fsdp1_clip_grad_norm",
    "fsdp2_wrap_predicate",
    "gradient_sync_disabled",
    "is_fsdp1_model",
    "is_fsdp2_model",
    "is_fsdp_plan",
    "module_class_from_name",
    "transformer_layer_classes",
]

FSDP_STRATEGY_NAMES = ("fsdp", "fsdp2")
# accelerate's FSDP_SHARDING_STRATEGY: position + 1 is the torch `ShardingStrategy` value.
_SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")


def is_fsdp_plan(plan: Plan) -> bool:
    """Whether the translation plan trains with FSDP (version 1 or 2)."""
    strategy = plan.strategy
    return strategy is not None and strategy.name in FSDP_STRATEGY_NAMES


# ---- wrap policies, resolved with the model ----------------------------------------------------------------


def module_class_from_name(model: nn.Module, name: str) -> type[nn.Module] | None:
    """The class called `name` among `model` and its submodules (depth first, as accelerate looks it up)."""
    if type(model).__name__ == name:
        return type(model)
    for child in model.children():
        found = module_class_from_name(child, name)
        if found is not None:
            return found
    return None


def transformer_layer_classes(model: nn.Module, plugin_args: dict[str, Any]) -> set[type[nn.Module]]:
    """The layer classes a transformer wrap policy wraps: `transformer_layer_cls_to_wrap`, else the model's
    `_no_split_modules`; ValueError for a name no submodule has."""
    names = plugin_args.get("transformer_cls_names_to_wrap")
    source = "fsdp_config['transformer_layer_cls_to_wrap']"
    if names is None:
        names = list(getattr(model, "_no_split_modules", None) or [])
        source = f"{type(model).__name__}._no_split_modules (the default of transformer_layer_cls_to_wrap)"
    elif isinstance(names, str):
        names = names.split(",")
    classes = set()
    for name in names:
        layer_class = module_class_from_name(model, name)
        if layer_class is None:
            raise ValueError(
                f"{source} names {name!r}, but {type(model).__name__} has no submodule of that class; set "
                "fsdp_config['transformer_layer_cls_to_wrap'] to class names of the model's layers"
            )
        classes.add(layer_class)
    return classes


def fsdp1_auto_wrap_policy(model: nn.Module, plugin_args: dict[str, Any]) -> Callable[..., bool] | None:
    """The FSDP1 `auto_wrap_policy` accelerate's plugin builds for `model` (None: a single FSDP unit)."""
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

    policy = plugin_args["auto_wrap_policy"]
    if policy == "TRANSFORMER_BASED_WRAP":
        classes = transformer_layer_classes(model, plugin_args)
        return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=classes)
    if policy == "SIZE_BASED_WRAP" and plugin_args.get("min_num_params", 0) > 0:
        return functools.partial(size_based_auto_wrap_policy, min_num_params=plugin_args["min_num_params"])
    return None


def fsdp2_wrap_predicate(model: nn.Module, plugin_args: dict[str, Any]) -> Callable[[nn.Module], bool] | None:
    """Which submodules get their own `fully_shard` unit (accelerate's `fsdp2_prepare_auto_wrap_policy`)."""
    policy = plugin_args["auto_wrap_policy"]
    if policy == "TRANSFORMER_BASED_WRAP":
        classes = tuple(transformer_layer_classes(model, plugin_args))

        def is_layer(module: nn.Module) -> bool:
            # Activation checkpointing wraps a layer before sharding: look through the wrapper.
            module = getattr(module, "_checkpoint_wrapped_module", module)
            return bool(classes) and isinstance(module, classes)

        return is_layer
    if policy == "SIZE_BASED_WRAP" and plugin_args.get("min_num_params", 0) > 0:
        threshold = plugin_args["min_num_params"]
        return lambda module: sum(p.numel() for p in module.parameters()) > threshold
    return None


def _children_bottom_up(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of `model`'s tree, children before parents, `model` itself last (accelerate's order)."""
    stack, ordered = [("", model)], []
    while stack:
        prefix, module = stack.pop()
        for name, child in module.named_children():
            stack.append((f"{prefix}.{name}" if prefix else name, child))
        ordered.append((prefix, module))
    return ordered[::-1]


# ---- precision ---------------------------------------------------------------------------------------------


def mixed_precision_dtype(plan: Any) -> torch.dtype | None:
    """The reference's FSDP mixed-precision dtype: bf16 / fp16 when the run autocasts, else None (full precision)."""
    precision = plan.lightning.precision
    return {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)


# ---- the facade's view ---------------------------------------------------------------------------------------


def _refuse_user_optimizer(optimizer: Any, lr_scheduler: Any) -> None:
    """The reference refuses `optimizers=` under FSDP: an optimizer built on the unwrapped model would update
    parameters FSDP no longer uses. Checked before the first wrap, when only the user can have made one (the
    trainer's `optimizer` and `lr_scheduler`)."""
    if optimizer is not None or lr_scheduler is not None:
        raise RuntimeError(
            "Passing `optimizers` is not allowed if PyTorch FSDP is enabled. You should subclass `Trainer` and "
            "override the `create_optimizer_and_scheduler` method."
        )


def _hand_to_facade(module: HandOverModule, wrapped: nn.Module) -> None:
    """The wrapped model becomes the module's and the facade's `model` / `model_wrapped` (the reference's FSDP rule),
    handed to the LightningModule, which sets the facade's state."""
    module.adopt_wrapped_model(wrapped, as_model=True, fsdp=True)


def is_fsdp2_model(model: Any) -> bool:
    """Whether `model` was sharded by FSDP2's `fully_shard` (cheap: nothing is imported when FSDP never was)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    fsdp_module = getattr(fsdp, "FSDPModule", None)
    return fsdp_module is not None and isinstance(model, fsdp_module)


def is_fsdp1_model(model: Any) -> bool:
    """Whether `model` is an FSDP1 wrapper (cheap: nothing is imported when FSDP never was)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(model, fsdp.FullyShardedDataParallel)


def fsdp1_clip_grad_norm(model: nn.Module, max_norm: float | None, inv_scale: float | None = None) -> torch.Tensor:
    """The pre-clip gradient norm over every rank's shard, clipping at `max_norm` (None: measure only; accelerate
    calls FSDP1's `clip_grad_norm_`). With fp16, gradients are still scaled by `1 / inv_scale` (Lightning unscales at
    the step): measure unscaled and clip by the same factor, which is what unscale-then-clip does."""
    if inv_scale is None:
        return model.clip_grad_norm_(float("inf") if max_norm is None else max_norm)
    norm = model.clip_grad_norm_(float("inf")) * inv_scale
    if max_norm is not None:
        parameters = [p for p in model.parameters() if p.grad is not None]
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
    return norm


@contextlib.contextmanager
def gradient_sync_disabled(model: nn.Module) -> Iterator[None]:
    """FSDP2's `no_sync`: no reduce-scatter on this micro-batch (accelerate's `no_sync` for `fully_shard` models)."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
