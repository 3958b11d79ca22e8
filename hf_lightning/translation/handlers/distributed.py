"""Registry entries: DDP, FSDP, DeepSpeed (R7.1-R7.3) and parallelism_config, and the strategy choice."""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from hf_lightning.args.fsdp_plugin import fsdp_plugin_args_from_config
from hf_lightning.args.parallel import apply_legacy_fsdp_to_config
from hf_lightning.translation.handlers.core import (
    Context,
    Decision,
    FieldEntry,
    honoured,
    not_applicable,
    refused,
)
from hf_lightning.translation.parallelism import (
    mesh_description,
    parallelism_refusal,
    parallelism_sizes,
    shards_parameters,
    tensor_parallel_size,
)
from hf_lightning.translation.plan import DeepSpeedDetails, FSDPDetails

if TYPE_CHECKING:
    from hf_lightning.translation.environment import Environment


def _load_json_config(value: Any) -> dict[str, Any]:
    """A dict (deep-copied) or a JSON file path -> a dict; the user's object is never modified."""
    if value is None:
        return {}
    if isinstance(value, str):
        with open(value, encoding="utf-8") as handle:
            return json.load(handle)
    return copy.deepcopy(dict(value))


def fsdp_config(args: Any) -> dict[str, Any]:
    """`fsdp_config` as a dict with the `fsdp_` key prefixes stripped (R7.2)."""
    config = _load_json_config(getattr(args, "fsdp_config", None))
    return {(key[5:] if key.startswith("fsdp_") else key): value for key, value in config.items()}


def select_strategy(args: Any, env: Environment) -> str:
    """Which Lightning strategy the run needs: single, ddp, fsdp (v1), fsdp2, deepspeed or tp."""
    if getattr(args, "fsdp", None):
        return "fsdp2" if int(fsdp_config(args).get("version", 2)) == 2 else "fsdp"
    if getattr(args, "deepspeed", None):
        return "deepspeed"
    if tensor_parallel_size(getattr(args, "parallelism_config", None)) > 1:
        return "tp"  # the model's tp plan on the mesh (hf_lightning/translation/parallelism.py)
    if shards_parameters(getattr(args, "parallelism_config", None)):
        return "fsdp2"  # dp_shard_size > 1: FSDP2 over the mesh (hf_lightning/translation/parallelism.py)
    if env.is_distributed_launch and env.world_size > 1:
        return "ddp"
    return "single"


# ------------------------------------------------------------------ DDP


def _not_ddp(ctx: Context) -> Decision:
    if ctx.strategy_name == "single":
        return not_applicable("one process: no DDP")
    return not_applicable(f"the {ctx.strategy_name} strategy does not use DDP options")


def _ddp_find_unused_parameters(field: str, value: Any, ctx: Context) -> Decision:
    if ctx.strategy_name != "ddp":
        return _not_ddp(ctx)
    if value is None:
        return honoured(
            "DDPStrategy find_unused_parameters resolved with the model (R7.3): not activation_checkpointing "
            "for a transformers model, True for a plain nn.Module (translate.resolve_ddp_kwargs)"
        )
    return honoured(
        f"DDPStrategy(find_unused_parameters={value})", strategy={"find_unused_parameters": value}
    )


def _ddp_option(lightning_name: str) -> Any:
    def handler(field: str, value: Any, ctx: Context) -> Decision:
        if ctx.strategy_name != "ddp":
            return _not_ddp(ctx)
        if value is None:
            return honoured("DDP default (not passed, as in the reference)")
        return honoured(f"DDPStrategy({lightning_name}={value!r})", strategy={lightning_name: value})

    return handler


def _ddp_backend(field: str, value: Any, ctx: Context) -> Decision:
    if not ctx.multi_process:
        return not_applicable("one process: no process group")
    if value is None:
        return honoured("Lightning's default process-group backend (nccl on CUDA, gloo on CPU)")
    return honoured(
        f"{ctx.strategy_name} strategy process_group_backend={value!r}",
        strategy={"process_group_backend": value},
    )


def _ddp_timeout(field: str, value: Any, ctx: Context) -> Decision:
    if not ctx.multi_process:
        return not_applicable("one process: no process group")
    return honoured(
        f"{ctx.strategy_name} strategy timeout=timedelta(seconds={value})",
        strategy={"timeout": timedelta(seconds=value)},
    )


# ------------------------------------------------------------------ FSDP


def fsdp_plugin_args(args: Any) -> dict[str, Any]:
    """The reference's `fsdp_plugin_args` (what it passes to accelerate's FSDP plugin), computed without touching
    `args` or the environment: `fsdp_config` with `fsdp_` prefixes stripped, legacy `fsdp` words applied (R7.2),
    then `args/fsdp_plugin.py`'s computation, the one `TrainingArguments` runs.

    Raises ValueError naming the key for a value the reference refuses.
    """
    config = fsdp_config(args)
    legacy = getattr(args, "fsdp", None)
    if isinstance(legacy, (str, list)):  # processed arguments hold True; a raw string comes from setattr
        apply_legacy_fsdp_to_config(legacy, config)
    return fsdp_plugin_args_from_config(config)


def _fsdp_refusal(ctx: Context, plugin: dict[str, Any]) -> str | None:
    """The reference's FSDP rules checked at Trainer build, and combinations hf_lightning does not carry out."""
    if ctx.accelerator == "mps":
        return "FSDP does not run on Apple MPS; remove fsdp, or run on CUDA GPUs or CPU (use_cpu=True)"
    if ctx.get("deepspeed"):
        return "fsdp and deepspeed are both set; choose one"
    if not ctx.env.is_distributed_launch:
        return "FSDP needs a distributed launch: torchrun --nproc_per_node N your_script.py"
    if ctx.get("torch_compile"):
        return "torch_compile with FSDP is not supported yet by hf_lightning; set torch_compile=False"
    if plugin.get("activation_checkpointing") and ctx.get("activation_checkpointing"):
        return (
            "fsdp_config['activation_checkpointing'] (FSDP's own activation checkpointing) and the "
            "activation_checkpointing argument can't both be True; use FSDP's and set activation_checkpointing=False"
        )
    if ctx.get("save_only_model") and ctx.get("load_best_model_at_end"):
        return "FSDP can't be used with save_only_model along with load_best_model_at_end; drop one of them"
    if ctx.get("save_only_model") and plugin["state_dict_type"] == "SHARDED_STATE_DICT":
        return "save_only_model is not compatible with fsdp_config['state_dict_type']='SHARDED_STATE_DICT'"
    if (
        plugin["fsdp_version"] == 2
        and plugin.get("activation_checkpointing")
        and plugin["auto_wrap_policy"] == "NO_WRAP"
    ):
        # The reference fails with a TypeError here (FSDP2 checkpoints the layers its wrap policy selects).
        return (
            "fsdp_config['activation_checkpointing'] with auto_wrap_policy='NO_WRAP' selects no layer under FSDP2; "
            "use TRANSFORMER_BASED_WRAP or SIZE_BASED_WRAP"
        )
    return None


def _fsdp(field: str, value: Any, ctx: Context) -> Decision:
    if not value:
        return honoured("no FSDP")
    config = fsdp_config(ctx.args)
    if config.get("xla") or config.get("xla_fsdp_v2"):
        return refused("XLA FSDP (fsdp_config['xla']) is TPU-only; remove the xla keys")
    try:
        plugin = fsdp_plugin_args(ctx.args)
    except ValueError as error:
        return refused(str(error))
    refusal = _fsdp_refusal(ctx, plugin)
    if refusal:
        return refused(refusal)
    details = FSDPDetails(
        version=plugin["fsdp_version"], plugin_args=plugin, state_dict_type=plugin["state_dict_type"]
    )
    where = "" if ctx.accelerator == "gpu" else " on CPU with gloo (the reference silently runs DDP there)"
    if plugin["fsdp_version"] == 2:
        how = "ModelParallelStrategy with fully_shard per wrapped layer (FSDP2), built by hf_lightning.strategies.fsdp.policies"
    else:
        how = "FSDPStrategy wrapping the model (FSDP1, deprecated), built by hf_lightning.strategies.fsdp.policies"
    return honoured(how + where, strategy={"fsdp": details})


def parallelism_config_decision(field: str, value: Any, ctx: Context) -> Decision:
    """`parallelism_config`: its sizes checked against the launch, dp_shard_size > 1 run as FSDP2 on the mesh."""
    if value is None:
        return not_applicable("no parallelism config")
    try:
        sizes = parallelism_sizes(value)
    except ValueError as error:
        return refused(str(error))
    world_size = ctx.env.world_size
    refusal = parallelism_refusal(sizes, world_size)
    if refusal:
        return refused(refusal)
    how = "hf_lightning/translation/parallelism.py: " + mesh_description(sizes, world_size)
    if sizes["tp_size"] > 1:
        return _tensor_parallel_decision(sizes["tp_size"], how, ctx)
    if sizes["dp_shard_size"] == 1:  # every size 1 (the others are refused): the run is as without it
        return not_applicable(how)
    if ctx.get("deepspeed"):
        return refused("parallelism_config.dp_shard_size > 1 and deepspeed are both set; choose one")
    if ctx.get("fsdp"):
        if ctx.strategy_name != "fsdp2":
            return refused(
                f"parallelism_config.dp_shard_size={sizes['dp_shard_size']} shards with FSDP2, but fsdp_config "
                "asks for FSDP1; set fsdp_config['version']=2"
            )
        return honoured(how + "; the FSDP2 options come from fsdp / fsdp_config")
    plugin = fsdp_plugin_args(SimpleNamespace(fsdp=True, fsdp_config=None))
    fsdp_refusal = _fsdp_refusal(ctx, plugin)
    if fsdp_refusal:
        return refused(f"parallelism_config.dp_shard_size={sizes['dp_shard_size']} (FSDP2): {fsdp_refusal}")
    details = FSDPDetails(version=2, plugin_args=plugin, state_dict_type=plugin["state_dict_type"])
    return honoured(
        how + "; fsdp_config's defaults (wrap by the model's _no_split_modules, full state dict checkpoints)",
        strategy={"fsdp": details},
    )


def _tensor_parallel_decision(tp_size: int, how: str, ctx: Context) -> Decision:
    """tp_size > 1 (the only size above 1): HFTensorParallelStrategy, or why not, naming the field."""
    field = f"parallelism_config.tp_size={tp_size}"
    for other in ("fsdp", "deepspeed"):
        if ctx.get(other):
            return refused(f"{field} and {other} are both set; tensor parallelism runs alone, remove {other}")
    if ctx.accelerator == "mps":
        return refused(f"{field}: tensor parallelism does not run on Apple MPS; run on CUDA GPUs or CPU")
    if ctx.get("torch_compile"):
        return refused(
            f"{field} with torch_compile is not supported yet by hf_lightning; set torch_compile=False"
        )
    return honoured(
        how + "; HFTensorParallelStrategy (hf_lightning.strategies.tensor_parallel.strategy); the model's "
        "plan is checked when the Trainer is built",
        strategy={"tensor_parallel_size": tp_size},
    )


def _fsdp_config(field: str, value: Any, ctx: Context) -> Decision:
    if not ctx.get("fsdp"):
        return not_applicable("fsdp is off")
    return honoured("normalised into the FSDP strategy description (see fsdp)")


# ------------------------------------------------------------------ DeepSpeed

# The config resolution lives in hf_lightning.args.deepspeed_config (pure dict work; `resolve_deepspeed_config` is
# re-exported here for older importers).
from hf_lightning.args.deepspeed_config import (  # noqa: E402
    config_owns_optimizer,
    config_owns_scheduler,
    is_offload,
    resolve_deepspeed_config,
    zero_stage,
)


def _deepspeed_refusal(ctx: Context) -> str | None:
    """Where DeepSpeed cannot run here, and the reference's own Trainer-build refusals (checked before the config)."""
    if ctx.accelerator != "gpu":
        return (
            "DeepSpeed needs CUDA GPUs (Lightning's DeepSpeedStrategy runs only there), and this run has none "
            "(use_cpu=True or no CUDA device); remove deepspeed, or run on CUDA GPUs"
        )
    if "deepspeed" not in ctx.env.installed_packages:
        return 'the deepspeed package is not installed: pip install -e ".[deepspeed]" from a checkout (or pip install deepspeed)'
    if ctx.get("save_only_model") and ctx.get("load_best_model_at_end"):
        return "DeepSpeed can't be used with `save_only_model` along with `load_best_model_at_end`; drop one of them"
    if ctx.get("torch_compile"):
        return "torch_compile with DeepSpeed is not supported yet by hf_lightning; set torch_compile=False"
    return None


def _deepspeed(field: str, value: Any, ctx: Context) -> Decision:
    if not value:
        return honoured("no DeepSpeed")
    refusal = _deepspeed_refusal(ctx)
    if refusal:
        return refused(refusal)
    try:
        resolved = resolve_deepspeed_config(value, ctx.args, ctx.env.world_size)
    except (ValueError, OSError) as error:
        return refused(str(error))
    config = resolved.config
    stage = zero_stage(config)
    if stage == 3 and ctx.get("auto_find_batch_size"):
        return refused(
            "`auto_find_batch_size` isn't supported yet with DeepSpeed Zero-3. Please consider using Zero-2, "
            "Zero-1, or FSDP"
        )
    optimizer = "the config's optimizer section" if config_owns_optimizer(config) else "args.optim"
    if config_owns_scheduler(config):
        scheduler = "the config's scheduler section (stepped by the engine)"
    elif config_owns_optimizer(config):
        scheduler = "lr_scheduler_type, built on DeepSpeed's optimizer and stepped by the engine"
    else:
        scheduler = "lr_scheduler_type, stepped by the trainer"
    pending = f"; {len(resolved.mismatches)} mismatch(es) with the arguments raise at train()" if resolved.mismatches else ""
    return honoured(
        f"HFDeepSpeedStrategy (hf_lightning.strategies.deepspeed.strategy): the engine wraps the model, ZeRO stage "
        f"{max(stage, 0)}{', offload' if is_offload(config) else ''}; optimizer from {optimizer}, schedule from "
        f"{scheduler}; 'auto' values filled from the arguments (R7.1), train-start ones at train(){pending}",
        strategy={
            "deepspeed": DeepSpeedDetails(config=config, mismatches=tuple(resolved.mismatches), zero_stage=stage)
        },
    )


ENTRIES: list[FieldEntry] = [
    FieldEntry(
        "ddp_find_unused_parameters",
        None,
        _ddp_find_unused_parameters,
        "DDPStrategy `find_unused_parameters` (default rule R7.3)",
    ),
    FieldEntry("ddp_bucket_cap_mb", None, _ddp_option("bucket_cap_mb"), "DDPStrategy `bucket_cap_mb`"),
    FieldEntry(
        "ddp_broadcast_buffers", None, _ddp_option("broadcast_buffers"), "DDPStrategy `broadcast_buffers`"
    ),
    FieldEntry("ddp_static_graph", None, _ddp_option("static_graph"), "DDPStrategy `static_graph`"),
    FieldEntry("ddp_backend", None, _ddp_backend, "strategy `process_group_backend`"),
    FieldEntry("ddp_timeout", 1800, _ddp_timeout, "strategy `timeout`"),
    FieldEntry("fsdp", None, _fsdp, "FSDP strategies (needs a launcher; CUDA GPUs or CPU)"),
    FieldEntry("fsdp_config", None, _fsdp_config, "FSDP options"),
    FieldEntry("deepspeed", None, _deepspeed, "DeepSpeedStrategy (needs CUDA)"),
]
