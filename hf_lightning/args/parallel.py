"""FSDP argument processing done while building ``TrainingArguments`` (R7.2).

Pure dictionary work: nothing here imports accelerate. The plugin arguments themselves come from
``args/fsdp_plugin.py``, the one computation the plan's translation also calls. The DeepSpeed config is loaded and its
argument-time ``"auto"`` keys filled by ``hf_lightning/args/deepspeed_config.py``, which owns it.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from typing import Any

from hf_lightning.args.fsdp_plugin import (
    FSDP_AUTO_WRAP_POLICY,
    FSDP_SHARDING_STRATEGY,
    fsdp_plugin_args_from_config,
)
from hf_lightning.args.truth import str_to_bool
from hf_lightning.core.enums import FSDPOption

logger = logging.getLogger(__name__)

__all__ = [
    "FSDP_AUTO_WRAP_POLICY",
    "FSDP_SHARDING_STRATEGY",
    "apply_legacy_fsdp_to_config",
    "process_fsdp_args",
    "str_to_bool",
]


def apply_legacy_fsdp_to_config(fsdp: str | list, fsdp_config: dict[str, Any]) -> None:
    """Translate a legacy ``fsdp`` string/list (``"full_shard offload auto_wrap"``) into ``fsdp_config`` keys.

    Keys already present in ``fsdp_config`` win. V15: unknown words, and FSDP1-only sharding words while
    ``version`` is 2, raise ``ValueError``.
    """
    kind = "a string" if isinstance(fsdp, str) else "a list"
    logger.warning(
        "Passing `fsdp` as %s is deprecated (the reference removes it in transformers v5.20). "
        "Use `fsdp=True` and configure everything via `fsdp_config` instead.",
        kind,
    )
    items = fsdp.split() if isinstance(fsdp, str) else list(fsdp)
    version = int(fsdp_config.get("version", 2))
    for item in items:
        if item.upper() in FSDP_SHARDING_STRATEGY:
            if version == 2:
                # FSDP2's reshard_after_forward is a bool: only full_shard / shard_grad_op map onto it.
                # The comparison is case-sensitive, as in the reference ("FULL_SHARD" is refused here).
                if item == FSDPOption.FULL_SHARD:
                    fsdp_config.setdefault("reshard_after_forward", True)
                elif item == FSDPOption.SHARD_GRAD_OP:
                    fsdp_config.setdefault("reshard_after_forward", False)
                else:
                    raise ValueError(
                        f"fsdp: `{item}` is only available with FSDP1. Set `fsdp_config['version'] = 1` to use it "
                        "(FSDP1 is deprecated), or use `full_shard` / `shard_grad_op`."
                    )
            else:
                fsdp_config.setdefault("reshard_after_forward", item)
        elif item == FSDPOption.OFFLOAD:
            fsdp_config.setdefault("cpu_offload", True)
        elif item == FSDPOption.AUTO_WRAP:
            pass  # the default policy already wraps transformer layers
        else:
            raise ValueError(
                f"fsdp: unknown `fsdp` option: {item}. Valid words are {[o.value for o in FSDPOption]}; "
                "prefer `fsdp=True` with `fsdp_config`."
            )


def process_fsdp_args(args: Any) -> dict[str, Any] | None:
    """Normalise ``args.fsdp`` / ``args.fsdp_config`` in place and return the FSDP plugin arguments.

    Mirrors the reference's ``_process_fsdp_args``: ``None`` when FSDP is off (or on the XLA path, where
    ``args.xla_fsdp_config`` is set instead); ``fsdp`` becomes ``True``; ``fsdp_`` key prefixes are
    stripped; the env variable ``FSDP_CPU_RAM_EFFICIENT_LOADING`` is exported as the reference does.
    """
    if not args.fsdp:
        return None
    if args.fsdp_config is None:
        args.fsdp_config = {}
    elif isinstance(args.fsdp_config, (str, os.PathLike)):
        with open(args.fsdp_config, encoding="utf-8") as f:
            args.fsdp_config = json.load(f)
    config: dict[str, Any] = args.fsdp_config
    for key in list(config):
        if key.startswith("fsdp_"):
            config[key[5:]] = config.pop(key)
    if isinstance(args.fsdp, (str, list)):
        apply_legacy_fsdp_to_config(args.fsdp, config)
    args.fsdp = True
    if args.activation_checkpointing:
        logger.warning(
            "When using FSDP, prefer `fsdp_config['activation_checkpointing']` (FSDP's own activation "
            "checkpointing) over the `activation_checkpointing` training argument; the latter introduces a "
            "redundant AllGather in the backward pass."
        )

    config["min_num_params"] = config.get("min_num_params", 0)
    if isinstance(config.get("transformer_layer_cls_to_wrap"), str):
        config["transformer_layer_cls_to_wrap"] = [config["transformer_layer_cls_to_wrap"]]
    config.setdefault("xla", False)
    config.setdefault("xla_fsdp_v2", False)
    config.setdefault("xla_fsdp_grad_ckpt", False)

    if config["xla"]:
        import torch  # torch is a hard dependency; imported here to keep this module light

        args.xla_fsdp_config = config.get("xla_fsdp_settings", {}).copy()
        for key in ("compute_dtype", "buffer_dtype"):
            if key in args.xla_fsdp_config:
                args.xla_fsdp_config[key] = getattr(torch, args.xla_fsdp_config[key])
        return None
    if config["xla_fsdp_grad_ckpt"]:
        warnings.warn("`--xla_fsdp_grad_ckpt` is useful only when `--xla` is set to true.", stacklevel=2)

    plugin_args = fsdp_plugin_args_from_config(config)
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = str(
        config.get("cpu_ram_efficient_loading", "false")
    ).lower()
    if plugin_args["fsdp_version"] == 1:
        logger.warning(
            "FSDP1 (`fsdp_config['version'] = 1`) is deprecated (removed in transformers v5.20). "
            "Please migrate to FSDP2 by setting `fsdp_config['version'] = 2` (the default)."
        )
    return plugin_args
