"""The FSDP plugin arguments from a normalised `fsdp_config`: the one computation of them (R7.2).

`args/parallel.py:process_fsdp_args` calls it while building `TrainingArguments` (the reference's
`fsdp_plugin_args` attribute) and `translation/handlers/distributed.py:fsdp_plugin_args` calls it for the plan,
so the two cannot disagree. A value the plugin would refuse later raises ValueError here, naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hf_lightning.args.truth import str_to_bool

# accelerate.utils.constants' lists, copied so accelerate stays optional; the order gives ShardingStrategy's values.
FSDP_SHARDING_STRATEGY = ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"]
FSDP_AUTO_WRAP_POLICY = ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]
_STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")
_BACKWARD_PREFETCH = ("NO_PREFETCH", "BACKWARD_PRE", "BACKWARD_POST")


def _truth(value: Any, key: str) -> bool:
    try:
        return str_to_bool(str(value).lower())
    except ValueError:
        raise ValueError(f"fsdp_config[{key!r}]={value!r} is not a truth value; use true or false") from None


def fsdp_plugin_args_from_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """What the reference passes to accelerate's FSDP plugin, from `fsdp_config` with its `fsdp_` prefixes
    stripped and the legacy `fsdp` words applied. Reads `config`, never changes it."""
    version = int(config.get("version", 2))
    if version not in (1, 2):
        raise ValueError(
            f"fsdp_config['version']={config['version']!r}: use 2 (fully_shard) or 1 (legacy wrapper)"
        )
    plugin: dict[str, Any] = {"fsdp_version": version}
    if config.get("cpu_offload", False):  # [quirk] truthiness only: the string "false" enables offload
        plugin["cpu_offload"] = True
    policy = config.get("auto_wrap_policy", FSDP_AUTO_WRAP_POLICY[0])
    if policy not in FSDP_AUTO_WRAP_POLICY:
        raise ValueError(
            f"fsdp_config['auto_wrap_policy']={policy!r}: use one of {FSDP_AUTO_WRAP_POLICY} (exact upper case)"
        )
    plugin["auto_wrap_policy"] = policy
    min_num_params = config.get("min_num_params", 0)
    layers = config.get("transformer_layer_cls_to_wrap")
    if isinstance(layers, str):
        layers = [layers]
    if policy == "SIZE_BASED_WRAP" and min_num_params > 0:
        plugin["min_num_params"] = min_num_params
    elif policy == "TRANSFORMER_BASED_WRAP" and layers is not None:
        plugin["transformer_cls_names_to_wrap"] = ",".join(layers)
    plugin["cpu_ram_efficient_loading"] = _truth(
        config.get("cpu_ram_efficient_loading", "false"), "cpu_ram_efficient_loading"
    )
    plugin["state_dict_type"] = config.get("state_dict_type", "FULL_STATE_DICT")
    if plugin["state_dict_type"] not in _STATE_DICT_TYPES:
        raise ValueError(
            f"fsdp_config['state_dict_type']={plugin['state_dict_type']!r}: use FULL_STATE_DICT or SHARDED_STATE_DICT"
        )
    if "activation_checkpointing" in config:
        plugin["activation_checkpointing"] = _truth(
            config["activation_checkpointing"], "activation_checkpointing"
        )
    if version == 2:
        plugin["reshard_after_forward"] = _truth(
            config.get("reshard_after_forward", True), "reshard_after_forward"
        )
        return plugin
    strategy = str(config.get("reshard_after_forward", "full_shard")).lower()
    if strategy.upper() not in FSDP_SHARDING_STRATEGY:
        raise ValueError(
            f"fsdp_config['reshard_after_forward']={strategy!r} (FSDP1 sharding strategy): use one of "
            f"{[name.lower() for name in FSDP_SHARDING_STRATEGY]}"
        )
    plugin["reshard_after_forward"] = strategy
    plugin["forward_prefetch"] = _truth(config.get("forward_prefetch", "false"), "forward_prefetch")
    plugin["backward_prefetch"] = str(config.get("backward_prefetch", "NO_PREFETCH")).upper()
    if plugin["backward_prefetch"] not in _BACKWARD_PREFETCH:
        raise ValueError(
            f"fsdp_config['backward_prefetch']={config['backward_prefetch']!r}: use NO_PREFETCH, BACKWARD_PRE or "
            "BACKWARD_POST"
        )
    for key in ("use_orig_params", "sync_module_states"):
        plugin[key] = _truth(config.get(key, "true"), key)
    if "limit_all_gathers" in config:
        plugin["limit_all_gathers"] = _truth(config["limit_all_gathers"], "limit_all_gathers")
    return plugin
