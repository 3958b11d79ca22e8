"""The DeepSpeed config the reference hands to `deepspeed.initialize`, built from the user's config and the
arguments (R7.1): every `"auto"` filled, explicit values checked against the arguments.

The reference fills the config in four places, reproduced here in the same order:

1. argument time, `HfTrainerDeepSpeedConfig.trainer_config_process` (`fill_at_argument_time`): batch sizes,
   accumulation, clipping, optimizer and scheduler hyper-parameters, fp16 / bf16;
2. accelerate's `DeepSpeedPlugin` and `set_mixed_precision`, still at argument time (`apply_plugin_defaults`):
   a missing `gradient_accumulation_steps` becomes 1, `steps_per_print` is silenced, `fp16` / `bf16` sections
   are added;
3. train start, `trainer_config_finalize` (`fill_at_train_start`): ZeRO bucket sizes from the model's hidden
   size, the scheduler's step counts from `max_steps` and the warmup rule; every recorded mismatch raises one
   ValueError here, before any step (T13);
4. `deepspeed_optim_sched` (`fill_at_prepare`): `zero_allow_untested_optimizer` when the trainer's optimizer is
   used.

Pure dictionary work: nothing here imports deepspeed, accelerate or transformers. accelerate's
`ACCELERATE_DEEPSPEED_*` variables (set by `accelerate launch` configs) are not read: `"auto"` plugin keys get
accelerate's defaults for unset variables (ZeRO stage 2, no offload, no 16-bit gather).
"""

from __future__ import annotations

import base64
import copy
import json
import os
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ResolvedDeepSpeedConfig",
    "apply_plugin_defaults",
    "config_owns_optimizer",
    "config_owns_scheduler",
    "deepspeed_fill_at_construction",
    "fill_at_argument_time",
    "fill_at_prepare",
    "fill_at_train_start",
    "finalize_deepspeed_config",
    "is_offload",
    "load_deepspeed_config",
    "mismatch_error",
    "model_hidden_size",
    "resolve_deepspeed_config",
    "zero_stage",
]

HIDDEN_SIZE_KEYS = (
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
)

# accelerate's DeepSpeedPlugin attributes for unset ACCELERATE_* variables, filled into "auto" keys only.
_PLUGIN_AUTO_DEFAULTS = {
    "zero_optimization.stage": 2,
    "zero_optimization.offload_optimizer.device": "none",
    "zero_optimization.offload_param.device": "none",
    "zero_optimization.offload_param.nvme_path": "none",
    "zero_optimization.offload_optimizer.nvme_path": "none",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
}


@dataclass
class ResolvedDeepSpeedConfig:
    """A config after the argument-time stages, and the mismatches recorded so far (raised at train start)."""

    config: dict[str, Any]
    mismatches: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DeepSpeedPluginView:
    """What `args.deepspeed_plugin` tells of a DeepSpeed run (the reference sets accelerate's `DeepSpeedPlugin`):
    TRL and PEFT read its `zero_stage` to decide how to build a model under ZeRO-3."""

    deepspeed_config: dict[str, Any]

    @property
    def zero_stage(self) -> int:
        return zero_stage(self.deepspeed_config)

    @property
    def hf_ds_config(self) -> Any:
        return self

    @property
    def config(self) -> dict[str, Any]:
        return self.deepspeed_config

    def is_zero3(self) -> bool:
        return self.zero_stage == 3


# ---------------------------------------------------------------- key access


def _find_node(config: dict[str, Any], dotted_key: str) -> tuple[dict[str, Any] | None, str]:
    """The section holding the last part of `dotted_key`, or None when a parent section is missing."""
    *parents, key = dotted_key.split(".")
    node: Any = config
    for name in parents:
        node = node.get(name)
        if node is None:
            return None, key
    return node, key


def get_value(config: dict[str, Any], dotted_key: str, default: Any = None) -> Any:
    """`config[a][b][c]` for `"a.b.c"`, or `default` when any part is missing."""
    node, key = _find_node(config, dotted_key)
    return default if node is None else node.get(key, default)


def _is_auto(config: dict[str, Any], dotted_key: str) -> bool:
    return get_value(config, dotted_key) == "auto"


def fill_match(
    config: dict[str, Any],
    mismatches: list[str],
    ds_key: str,
    hf_value: Any,
    hf_key: str | None = None,
    must_match: bool = True,
) -> None:
    """The reference's `fill_match`: `"auto"` becomes `hf_value`; an explicit value that differs is recorded.

    A missing key (or section) is left missing; an explicit `None` never mismatches.
    """
    node, key = _find_node(config, ds_key)
    if node is None:
        return
    if node.get(key) == "auto":
        node[key] = hf_value
        return
    if not must_match:
        return
    ds_value = node.get(key)
    if ds_value is not None and ds_value != hf_value:
        mismatches.append(f"- ds {ds_key}={ds_value} vs hf {hf_key}={hf_value}")


def _fill_only(config: dict[str, Any], ds_key: str, value: Any) -> None:
    fill_match(config, [], ds_key, value, must_match=False)


# ---------------------------------------------------------------- what the config says


def zero_stage(config: dict[str, Any]) -> int:
    """`zero_optimization.stage` (-1 when unset, as the reference's `HfDeepSpeedConfig` reports it)."""
    return get_value(config, "zero_optimization.stage", -1)


def is_offload(config: dict[str, Any]) -> bool:
    """ZeRO-2/3 with the optimizer or the parameters offloaded to CPU or NVMe (the reference's `is_offload`)."""
    if zero_stage(config) not in (2, 3):
        return False
    devices = {
        get_value(config, "zero_optimization.offload_optimizer.device"),
        get_value(config, "zero_optimization.offload_param.device"),
    }
    return bool(devices & {"cpu", "nvme"})


def config_owns_optimizer(config: dict[str, Any]) -> bool:
    """An `optimizer` section: DeepSpeed builds the optimizer and `args.optim` is not used (R5.1)."""
    return "optimizer" in config


def config_owns_scheduler(config: dict[str, Any]) -> bool:
    """A `scheduler` section: DeepSpeed builds the scheduler and `lr_scheduler_type` is not used (R5.4)."""
    return "scheduler" in config


# ---------------------------------------------------------------- stage 1: argument time


def fill_at_argument_time(
    config: dict[str, Any], args: Any, world_size: int, auto_find_batch_size: bool = False
) -> list[str]:
    """`trainer_config_process`: fill the argument-time keys of R7.1 in place; return the mismatches."""
    mismatches: list[str] = []
    batch = args.per_device_train_batch_size
    accumulation = args.gradient_accumulation_steps
    # DeepSpeed checks train_batch_size == world_size * train_micro_batch_size_per_gpu * gradient_accumulation_steps.
    train_batch_size = world_size * batch * accumulation
    fill = fill_match
    fill(
        config,
        mismatches,
        "train_micro_batch_size_per_gpu",
        batch,
        "per_device_train_batch_size",
        not auto_find_batch_size,
    )
    fill(config, mismatches, "gradient_accumulation_steps", accumulation, "gradient_accumulation_steps")
    fill(
        config,
        mismatches,
        "train_batch_size",
        train_batch_size,
        "train_batch_size (calculated)",
        not auto_find_batch_size,
    )
    fill(config, mismatches, "gradient_clipping", args.max_grad_norm, "max_grad_norm")
    fill(config, mismatches, "optimizer.params.lr", args.learning_rate, "learning_rate")
    fill(
        config,
        mismatches,
        "optimizer.params.betas",
        [args.adam_beta1, args.adam_beta2],
        "adam_beta1+adam_beta2",
    )
    fill(config, mismatches, "optimizer.params.eps", args.adam_epsilon, "adam_epsilon")
    fill(config, mismatches, "optimizer.params.weight_decay", args.weight_decay, "weight_decay")
    _fill_only(config, "scheduler.params.warmup_min_lr", 0)  # not an argument
    fill(config, mismatches, "scheduler.params.warmup_max_lr", args.learning_rate, "learning_rate")
    if args.save_on_each_node:
        # DeepSpeed assumes shared storage; save_on_each_node asks for node-local checkpoints.
        config["checkpoint"] = config.get("checkpoint", {})
        config["checkpoint"]["use_node_local_storage"] = args.save_on_each_node
    fill(config, mismatches, "fp16.enabled", args.fp16 or args.fp16_full_eval, "fp16|fp16_full_eval")
    fill(config, mismatches, "bf16.enabled", args.bf16 or args.bf16_full_eval, "bf16|bf16_full_eval")
    return mismatches


def load_deepspeed_config(value: dict | str | os.PathLike) -> dict[str, Any]:
    """Deep copy of a DeepSpeed config given as a dict, a JSON file path, a JSON string or base64 JSON."""
    if isinstance(value, dict):
        # The user's dict is never modified: after "auto" filling it would no longer be reusable.
        return copy.deepcopy(value)
    if os.path.exists(value):
        with open(value, encoding="utf-8") as f:
            return json.load(f)
    try:
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return json.loads(base64.urlsafe_b64decode(value).decode("utf-8"))
    except (UnicodeDecodeError, AttributeError, ValueError, TypeError):
        raise ValueError(
            f"deepspeed: expected a path to an existing DeepSpeed config, a dict, or a base64 encoded JSON "
            f"string; received {value!r}."
        ) from None


def deepspeed_fill_at_construction(
    config: dict[str, Any], args: Any, auto_find_batch_size: bool = False
) -> list[str]:
    """Fill the argument-construction ``"auto"`` keys of R7.1 in ``config`` in place; return the mismatches.

    V16: a config without a ``zero_optimization`` section raises ``ValueError`` (accelerate's rule).
    The mismatches are raised together at the start of ``train()``, as in the reference.
    """
    mismatches = fill_at_argument_time(config, args, args.world_size, auto_find_batch_size)
    if "zero_optimization" not in config:
        raise ValueError(
            "deepspeed: please specify the ZeRO optimization config (a `zero_optimization` section, e.g. "
            '{"zero_optimization": {"stage": 2}}) in the DeepSpeed config.'
        )
    return mismatches


# ---------------------------------------------------------------- stage 2: accelerate's plugin


def apply_plugin_defaults(config: dict[str, Any], mixed_precision: str) -> None:
    """What accelerate's `DeepSpeedPlugin` and `set_mixed_precision(mixed_precision)` do to the config, in place.

    Raises ValueError (accelerate's messages) without a `zero_optimization` section, or when `mixed_precision`
    asks for one 16-bit type while the config enables the other.
    """
    if "gradient_accumulation_steps" not in config:
        config["gradient_accumulation_steps"] = 1
    if "zero_optimization" not in config:
        raise ValueError(
            "deepspeed: please specify the ZeRO optimization config (a `zero_optimization` section, e.g. "
            '{"zero_optimization": {"stage": 2}}) in the DeepSpeed config.'
        )
    for key, value in _PLUGIN_AUTO_DEFAULTS.items():
        _fill_only(config, key, value)
    config["steps_per_print"] = float("inf")  # stops DeepSpeed's own progress prints
    if mixed_precision == "fp16" and "fp16" not in config:
        config["fp16"] = {"enabled": True, "auto_cast": True}
    elif mixed_precision in ("bf16", "fp8") and "bf16" not in config:
        config["bf16"] = {"enabled": True}
    if mixed_precision != "no":
        other = "bf16" if mixed_precision == "fp16" else "fp16"
        if str(config.get(other, {}).get("enabled", "False")).lower() == "true":
            raise ValueError(
                f"`--mixed_precision` arg cannot be set to `{mixed_precision}` when `{other}` is set in the "
                "DeepSpeed config file."
            )
    for dtype in ("fp16", "bf16"):
        if dtype not in config:
            config[dtype] = {"enabled": False}
    _fill_only(config, "fp16.enabled", mixed_precision == "fp16")
    _fill_only(config, "bf16.enabled", mixed_precision in ("bf16", "fp8"))


def resolve_deepspeed_config(
    value: Any, args: Any, world_size: int, auto_find_batch_size: bool = False
) -> ResolvedDeepSpeedConfig:
    """The argument-time stages on a copy of `value` (a dict, a JSON path, JSON text or base64 JSON).

    The user's object is never modified. Mismatches are recorded, not raised: the reference raises them at
    train start (`finalize_deepspeed_config`).
    """
    config = load_deepspeed_config(value)
    mismatches = fill_at_argument_time(config, args, world_size, auto_find_batch_size)
    apply_plugin_defaults(config, getattr(args, "mixed_precision", "no") or "no")
    return ResolvedDeepSpeedConfig(config, mismatches)


# ---------------------------------------------------------------- stage 3: train start


def model_hidden_size(model: Any) -> int | None:
    """`config.hidden_size`, else `max(config.hidden_sizes)`, else the same on `config.text_config`."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    if hasattr(config, "hidden_size"):
        return config.hidden_size
    if hasattr(config, "hidden_sizes"):
        return max(config.hidden_sizes)  # several stages: the largest
    text_config = getattr(config, "text_config", None)
    if text_config is not None and hasattr(text_config, "hidden_size"):
        return text_config.hidden_size
    if text_config is not None and hasattr(text_config, "hidden_sizes"):
        return max(text_config.hidden_sizes)
    return None


def mismatch_error(mismatches: list[str]) -> ValueError:
    """The reference's error for explicit config values that contradict the arguments."""
    listed = "\n".join(mismatches)
    return ValueError(
        "Please correct the following DeepSpeed config values that mismatch TrainingArguments"
        f" values:\n{listed}\nThe easiest method is to set these DeepSpeed config values to 'auto'."
    )


def fill_at_train_start(
    config: dict[str, Any], mismatches: list[str], args: Any, model: Any, num_training_steps: int
) -> None:
    """`trainer_config_finalize`: fill the train-start keys of R7.1 in place, then raise if any mismatch exists."""
    hidden_size_auto_keys = [key for key in HIDDEN_SIZE_KEYS if _is_auto(config, key)]
    if hidden_size_auto_keys:
        hidden_size = model_hidden_size(model)
        if hidden_size is None:
            raise ValueError(
                "The model's config file has neither `hidden_size` nor `hidden_sizes` entry, "
                "therefore it's not possible to automatically fill out the following `auto` entries "
                f"in the DeepSpeed config file: {hidden_size_auto_keys}. You can fix that by replacing "
                "`auto` values for these keys with an integer value of your choice."
            )
        _fill_only(config, "zero_optimization.reduce_bucket_size", hidden_size * hidden_size)
        if zero_stage(config) == 3:
            _fill_only(
                config, "zero_optimization.stage3_prefetch_bucket_size", int(0.9 * hidden_size * hidden_size)
            )
            _fill_only(config, "zero_optimization.stage3_param_persistence_threshold", 10 * hidden_size)
    fill_match(
        config,
        mismatches,
        "scheduler.params.total_num_steps",
        num_training_steps,
        "num_training_steps (calculated)",
    )
    # deepspeed >= 0.19.6 rejects warmup_num_steps <= 0: a run without warmup gets 1, as in the reference.
    fill_match(
        config,
        mismatches,
        "scheduler.params.warmup_num_steps",
        max(1, args.get_warmup_steps(num_training_steps)),
        "warmup_steps",
    )
    if mismatches:
        raise mismatch_error(mismatches)


def fill_at_prepare(config: dict[str, Any]) -> None:
    """`deepspeed_optim_sched`: the trainer's own optimizer needs DeepSpeed's `zero_allow_untested_optimizer`."""
    if not config_owns_optimizer(config):
        config["zero_allow_untested_optimizer"] = True


def finalize_deepspeed_config(
    resolved: ResolvedDeepSpeedConfig, args: Any, model: Any, num_training_steps: int
) -> dict[str, Any]:
    """The config `deepspeed.initialize` receives: the train-start stages on a copy; raises on mismatches."""
    config = copy.deepcopy(resolved.config)
    fill_at_train_start(config, list(resolved.mismatches), args, model, num_training_steps)
    fill_at_prepare(config)
    return config
