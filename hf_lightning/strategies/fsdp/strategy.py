"""The Lightning strategies for FSDP (version 1 `HFFSDPStrategy`, version 2 `HFFSDP2Strategy`) and
`build_fsdp_strategy`; the option table and the reasons for the subclasses are in `hf_lightning/strategies/fsdp/policies.py`."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.plugins.precision import FSDPPrecision
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy, Strategy
from torch import nn

from hf_lightning.strategies.fsdp.policies import (
    _SHARDING_STRATEGIES,
    _children_bottom_up,
    _hand_to_facade,
    _refuse_user_optimizer,
    fsdp1_auto_wrap_policy,
    fsdp2_wrap_predicate,
    is_fsdp_plan,
    mixed_precision_dtype,
)
from hf_lightning.strategies.process_group_options import process_group_kwargs
from hf_lightning.strategies.uneven_nodes import launched_world_size

if TYPE_CHECKING:
    from hf_lightning.strategies.ports import HandOverModule


@functools.cache
def _forward_only_fsdp_precision_class() -> type:
    class ForwardOnlyFSDPPrecision(FSDPPrecision):
        """Lightning's FSDP fp16 plugin (sharded grad scaler) without its step-wide autocast (precision.py)."""

        def forward_context(self):  # type: ignore[override]
            return contextlib.nullcontext()

    return ForwardOnlyFSDPPrecision


# ---- FSDP1 ---------------------------------------------------------------------------------------------------


class HFFSDPStrategy(FSDPStrategy):
    """`FSDPStrategy` whose FullyShardedDataParallel wraps the user's model inside the LightningModule."""

    @property
    def precision_plugin(self) -> FSDPPrecision:
        return FSDPStrategy.precision_plugin.fget(self)

    @precision_plugin.setter
    def precision_plugin(self, plugin: Any) -> None:
        # fp16 arrives as hf_lightning's forward-only mixed-precision plugin (precision.py); FSDP needs its
        # sharded grad scaler, still without the step-wide autocast.
        if plugin is not None and not isinstance(plugin, FSDPPrecision) and plugin.precision == "16-mixed":
            plugin = _forward_only_fsdp_precision_class()("16-mixed")
        FSDPStrategy.precision_plugin.fset(self, plugin)

    def _setup_model(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import FullyShardedDataParallel

        user_model = model.facade.model
        if isinstance(user_model, FullyShardedDataParallel):  # a later train() call: already wrapped
            _hand_to_facade(model, user_model)
            return model
        _refuse_user_optimizer(model.facade.optimizer, model.facade.lr_scheduler)
        kwargs = dict(self.kwargs)
        if kwargs.get("sync_module_states") and self.root_device.type == "cpu":
            # FSDP1 broadcasts rank 0's states only from GPU memory; on CPU the same broadcast is done here.
            _broadcast_module_states(user_model)
            kwargs["sync_module_states"] = False
        elif kwargs.get("sync_module_states"):
            device = self.root_device
            # accelerate's param_init_fn: modules left on the meta device get storage, then rank 0's values.
            kwargs.setdefault("param_init_fn", lambda module: module.to_empty(device=device, recurse=False))
        wrapped = FullyShardedDataParallel(
            user_model,
            cpu_offload=self.cpu_offload,
            mixed_precision=self.mixed_precision,  # the reference's policy, never the plugin's default
            sharding_strategy=self.sharding_strategy,
            device_id=self.root_device,  # an explicit device lets FSDP1 run on CPU (gloo)
            **kwargs,
        )
        if self._activation_checkpointing_kwargs:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                CheckpointImpl,
                apply_activation_checkpointing,
                checkpoint_wrapper,
            )

            wrapper = functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
            apply_activation_checkpointing(
                wrapped, checkpoint_wrapper_fn=wrapper, **self._activation_checkpointing_kwargs
            )
        _hand_to_facade(model, wrapped)
        return model


def _broadcast_module_states(model: nn.Module) -> None:
    """Every rank takes rank 0's parameters and buffers (what FSDP1's `sync_module_states` does)."""
    import torch.distributed as dist

    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)


def _build_fsdp1(plan: Any, model: nn.Module, plugin: dict[str, Any]) -> HFFSDPStrategy:
    from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy

    policy = fsdp1_auto_wrap_policy(model, plugin)
    sharding = ShardingStrategy(_SHARDING_STRATEGIES.index(plugin["reshard_after_forward"].upper()) + 1)
    dtype = mixed_precision_dtype(plan)
    prefetch = plugin["backward_prefetch"]
    kwargs: dict[str, Any] = {
        "sharding_strategy": sharding,
        "cpu_offload": CPUOffload(offload_params=bool(plugin.get("cpu_offload", False))),
        "mixed_precision": (
            MixedPrecision(param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=dtype) if dtype else None
        ),
        "auto_wrap_policy": policy,
        "state_dict_type": "sharded" if plugin["state_dict_type"] == "SHARDED_STATE_DICT" else "full",
        "use_orig_params": plugin["use_orig_params"],
        "forward_prefetch": plugin["forward_prefetch"],
        "backward_prefetch": None if prefetch == "NO_PREFETCH" else BackwardPrefetch[prefetch],
        "limit_all_gathers": plugin.get("limit_all_gathers", True),  # accelerate's default
        # accelerate forces it on with cpu_ram_efficient_loading: the weights of rank 0 are the run's.
        "sync_module_states": plugin["sync_module_states"] or plugin["cpu_ram_efficient_loading"],
    }
    if "HYBRID" in sharding.name and launched_world_size(plan) != plan.lightning.num_nodes * plan.lightning.devices:
        raise ValueError(
            f"fsdp_config sharding {sharding.name}: the nodes hold different process counts (this node "
            f"{plan.lightning.devices} of {launched_world_size(plan)}), and hybrid sharding shards within a node and "
            "replicates across nodes of equal size; use FULL_SHARD or SHARD_GRAD_OP, or the same --nproc_per_node "
            "on every node."
        )
    if "HYBRID" in sharding.name and policy is None:
        # Lightning wants the (replicate, shard) layout spelled out; FSDP's own default is nodes x local devices.
        kwargs["device_mesh"] = (plan.lightning.num_nodes, plan.lightning.devices)
    strategy = HFFSDPStrategy(**process_group_kwargs(plan.strategy), **kwargs)
    if plugin.get("activation_checkpointing"):
        # accelerate checkpoints the modules its wrap policy selects (every module when there is none).
        strategy._activation_checkpointing_kwargs = {"auto_wrap_policy": policy}
    return strategy


# ---- FSDP2 ---------------------------------------------------------------------------------------------------


class HFFSDP2Strategy(ModelParallelStrategy):
    """`ModelParallelStrategy` (data parallel only) that applies `fully_shard` to the user's model as accelerate's
    `fsdp2_prepare_model` does; called from `HFLightningModule.configure_model`."""

    # accelerate does not wrap an FSDP2 model's forward in autocast: mixed precision is the MixedPrecisionPolicy.
    owns_forward_precision = True

    def __init__(
        self,
        *,
        data_parallel_size: int,
        reshard_after_forward: bool = True,
        cpu_offload: bool = False,
        mixed_precision_dtype: torch.dtype | None = None,
        wrap_predicate: Callable[[nn.Module], bool] | None = None,
        activation_checkpointing: bool = False,
        cpu_ram_efficient_loading: bool = False,
        state_dict_type: str = "FULL_STATE_DICT",
        **kwargs: Any,
    ) -> None:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

        super().__init__(
            data_parallel_size=data_parallel_size,
            tensor_parallel_size=1,
            save_distributed_checkpoint=state_dict_type == "SHARDED_STATE_DICT",
            **kwargs,
        )
        dtype = mixed_precision_dtype
        self.reshard_after_forward = reshard_after_forward
        self.cpu_offload = cpu_offload
        self.offload_policy = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
        self.mp_policy = (
            MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype, output_dtype=dtype)
            if dtype is not None
            else MixedPrecisionPolicy()
        )
        self.wrap_predicate = wrap_predicate
        self.activation_checkpointing = activation_checkpointing
        self.cpu_ram_efficient_loading = cpu_ram_efficient_loading
        self.state_dict_type = state_dict_type

    def model_to_device(self) -> None:
        # fully_shard placed every parameter (on the CPU with cpu_offload); a blanket `.to()` would undo that.
        pass

    def shard_user_model(self, module: HandOverModule) -> None:
        """Apply activation checkpointing, then `fully_shard` per selected layer, extra units and the root."""
        from torch.distributed.fsdp import FSDPModule, fully_shard

        model = module.facade.model
        if isinstance(model, FSDPModule):  # a later train() call: already sharded
            _hand_to_facade(module, model)
            return
        _refuse_user_optimizer(module.facade.optimizer, module.facade.lr_scheduler)
        if self.activation_checkpointing:
            _apply_activation_checkpointing(model, self.wrap_predicate)
        if self.mp_policy.param_dtype is not None:
            # accelerate keeps fp32 master weights: trainable low-precision parameters are upcast first.
            for parameter in model.parameters():
                if parameter.requires_grad and parameter.dtype != torch.float32:
                    parameter.data = parameter.data.to(torch.float32)
        full_state = model.state_dict() if self.cpu_ram_efficient_loading else None
        kwargs = {
            "reshard_after_forward": self.reshard_after_forward,
            "offload_policy": self.offload_policy,
            "mp_policy": self.mp_policy,
            "mesh": self.device_mesh["data_parallel"],
        }
        if self.wrap_predicate is not None:
            for _, submodule in _children_bottom_up(model)[:-1]:
                if self.wrap_predicate(submodule) and not isinstance(submodule, FSDPModule):
                    fully_shard(submodule, **kwargs)
        _shard_embeddings_and_tail(model, kwargs)
        # The root keeps PyTorch's own reshard default (False for the root), as accelerate leaves it.
        fully_shard(model, **{key: value for key, value in kwargs.items() if key != "reshard_after_forward"})
        if full_state is not None:
            _broadcast_rank0_weights(model, full_state, self.global_rank, offload=self.cpu_offload)
        if callable(getattr(model, "generate", None)):
            from torch.distributed.fsdp import register_fsdp_forward_method

            # As the reference: generate() gathers the shards like forward() (predict_with_generate).
            register_fsdp_forward_method(model, "generate")
        _hand_to_facade(module, model)


def _apply_activation_checkpointing(model: nn.Module, predicate: Callable[[nn.Module], bool] | None) -> None:
    """accelerate's `fsdp2_apply_ac`: a non-reentrant checkpoint wrapper on each layer the wrap policy selects."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for name, layer in _children_bottom_up(model)[:-1]:
        if predicate(layer):
            model.set_submodule(name, checkpoint_wrapper(layer, preserve_rng_state=False))


def _final_norm(model: nn.Module) -> nn.Module | None:
    """The last direct child of the base model whose class name holds "Norm" (accelerate's `_find_final_norm`)."""
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None) if prefix else model
    if not isinstance(base, nn.Module):
        return None
    found = None
    for _, child in base.named_children():
        if "Norm" in type(child).__name__:
            found = child
    return found


def _unsharded(module: nn.Module | None) -> bool:
    """A module no FSDP unit manages yet. accelerate only checks the module itself, so a layer inside an
    already-sharded unit (BERT's word embeddings inside `BertEmbeddings`, one of its `_no_split_modules`) would be
    sharded twice, which torch refuses; such a module stays in its unit here."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    if module is None or isinstance(module, FSDPModule):
        return False
    return not any(isinstance(parameter, DTensor) for parameter in module.parameters())


def _shard_embeddings_and_tail(model: nn.Module, kwargs: dict[str, Any]) -> None:
    """accelerate's extra FSDP2 units: the input embeddings, and [final norm, output embeddings] kept unsharded
    after forward (tied embeddings go into the tail group, since a shared parameter may live in one group only)."""
    from torch.distributed.fsdp import fully_shard

    input_embed = getattr(model, "get_input_embeddings", lambda: None)()
    output_embed = getattr(model, "get_output_embeddings", lambda: None)()
    input_weight = getattr(input_embed, "weight", None)
    tied = input_weight is not None and input_weight is getattr(output_embed, "weight", None)
    if not tied and _unsharded(input_embed):
        fully_shard(input_embed, **kwargs)
    norm = _final_norm(model)
    candidates = (norm, input_embed, output_embed) if tied else (norm, output_embed)
    tail = [m for m in candidates if _unsharded(m)]
    if tail:
        fully_shard(tail, **{**kwargs, "reshard_after_forward": False})


def _broadcast_rank0_weights(
    model: nn.Module, full_state: dict[str, Any], rank: int, *, offload: bool
) -> None:
    """`cpu_ram_efficient_loading`: every shard takes rank 0's weights (accelerate's `fsdp2_load_full_state_dict`)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, cpu_offload=offload)
    set_model_state_dict(model, full_state if rank == 0 else {}, options=options)


def _build_fsdp2(plan: Any, model: nn.Module, plugin: dict[str, Any]) -> HFFSDP2Strategy:
    world_size = launched_world_size(plan)  # devices x num_nodes is not it when nodes hold different counts
    return HFFSDP2Strategy(
        data_parallel_size=world_size,
        reshard_after_forward=plugin["reshard_after_forward"],
        cpu_offload=bool(plugin.get("cpu_offload", False)),
        mixed_precision_dtype=mixed_precision_dtype(plan),
        wrap_predicate=fsdp2_wrap_predicate(model, plugin),
        activation_checkpointing=bool(plugin.get("activation_checkpointing", False)),
        cpu_ram_efficient_loading=plugin["cpu_ram_efficient_loading"],
        state_dict_type=plugin["state_dict_type"],
        **process_group_kwargs(plan.strategy),
    )


def build_fsdp_strategy(plan: Any, model: nn.Module) -> Strategy:
    """The Lightning strategy of an FSDP plan, its wrap policy resolved with `model` (the user's model)."""
    if not is_fsdp_plan(plan):
        raise ValueError("the plan does not use FSDP")
    details = plan.strategy.fsdp
    plugin = details.plugin_args
    if details.version == 1:
        return _build_fsdp1(plan, model, plugin)
    return _build_fsdp2(plan, model, plugin)
