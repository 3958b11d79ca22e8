"""v4-era argument names (R1.5) accepted as constructor keywords and folded into v5 fields.

They are not dataclass fields: ``dataclasses.fields()`` and ``to_dict()`` hold only the reference's v5
names. Each alias warns with a ``FutureWarning``, translates to its v5 field, raises ``ValueError``
when it conflicts with a value given for its replacement, and refuses values v5 cannot honour.
An alias given at its v4 default value (as found in a v4 ``to_dict()`` dump) only warns.
"""

from __future__ import annotations

import functools
import json
import os
import warnings
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from hf_lightning.args.declarations import convert_str_dict
from hf_lightning.args.user_warnings import user_stacklevel
from hf_lightning.core.enums import enum_value

__all__ = ["ALIAS_ATTRIBUTE_DEFAULTS", "V4_ALIASES", "fold_v4_aliases", "with_v4_aliases"]

C = TypeVar("C", bound=type)

# Attributes (not fields) the aliases may set; every instance gets them, with these defaults.
ALIAS_ATTRIBUTE_DEFAULTS: dict[str, Any] = {"logging_dir": None, "warmup_ratio": None}


class _Fold:
    """State of one constructor call: the keyword values for the dataclass and the extra attributes."""

    def __init__(self, kwargs: dict[str, Any], aliases: dict[str, Any]) -> None:
        self.kwargs = kwargs
        self.aliases = aliases
        self.attributes: dict[str, Any] = dict(ALIAS_ATTRIBUTE_DEFAULTS)

    def set_field(self, alias: str, field_name: str, value: Any) -> None:
        """Set a v5 field from an alias; a different value already given for it is a conflict."""
        if field_name in self.kwargs and not _same(self.kwargs[field_name], value):
            raise ValueError(
                f"`{alias}`={self.aliases[alias]!r} conflicts with `{field_name}`={self.kwargs[field_name]!r}. "
                f"`{alias}` is the v4 name; pass only `{field_name}`."
            )
        self.kwargs[field_name] = value

    def set_dict_key(self, alias: str, field_name: str, key: str, value: Any) -> None:
        """Set ``key`` inside the dict field ``field_name`` (loading a JSON string or file first)."""
        config = _as_dict(self.kwargs.get(field_name), field_name)
        for existing in (key, f"fsdp_{key}") if field_name == "fsdp_config" else (key,):
            if existing in config and not _same(config[existing], value):
                raise ValueError(
                    f"`{alias}`={self.aliases[alias]!r} conflicts with `{field_name}['{existing}']`="
                    f"{config[existing]!r}. `{alias}` is the v4 name; set only `{field_name}['{key}']`."
                )
        config[key] = value
        self.kwargs[field_name] = config


def _same(a: Any, b: Any) -> bool:
    """Equality after turning enums into their values (``"steps"`` equals ``IntervalStrategy.STEPS``)."""
    return enum_value(a) == enum_value(b)


def _as_dict(value: Any, field_name: str) -> dict[str, Any]:
    """A fresh dict from a dict-typed field value (None, dict, JSON string, JSON file, config object)."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, str) and value.startswith("{"):
        return convert_str_dict(json.loads(value))
    if isinstance(value, (str, os.PathLike)):
        with open(value, encoding="utf-8") as f:
            return json.load(f)
    if callable(getattr(value, "to_dict", None)):
        return dict(value.to_dict())
    raise ValueError(f"{field_name}: cannot merge a v4 alias into a {type(value).__name__}; pass a dict.")


def _refuse(alias: str, value: Any, why: str) -> None:
    raise ValueError(f"`{alias}`={value!r} is not supported: {why}")


def _rename(field_name: str) -> Callable[[_Fold, str, Any], None]:
    """Alias whose value goes unchanged into ``field_name``."""

    def handler(fold: _Fold, alias: str, value: Any) -> None:
        fold.set_field(alias, field_name, value)

    return handler


def _no_op(fold: _Fold, alias: str, value: Any) -> None:
    """Warning-only alias: v5 decides this by itself."""


def _refuse_set(why: str) -> Callable[[_Fold, str, Any], None]:
    """Alias refused whenever it is given with a value other than its v4 default."""

    def handler(fold: _Fold, alias: str, value: Any) -> None:
        _refuse(alias, value, why)

    return handler


def _warmup_ratio(fold: _Fold, alias: str, value: Any) -> None:
    if not 0 <= value <= 1:
        _refuse(
            alias, value, "a warmup ratio must be in [0, 1]; use `warmup_steps` (a float < 1 is a ratio)."
        )
    given_steps = fold.kwargs.get("warmup_steps", 0)
    if given_steps != 0 and given_steps != value:
        raise ValueError(
            f"`warmup_ratio`={value!r} conflicts with `warmup_steps`={given_steps!r}. `warmup_ratio` is the v4 "
            "name; pass only `warmup_steps` (a value in [0, 1) is a ratio of the total steps)."
        )
    if value < 1:
        fold.kwargs["warmup_steps"] = value
    else:
        # v5 reads warmup_steps=1.0 as one step; a full-length warmup is resolved at train start instead.
        fold.attributes["warmup_ratio"] = value


def _logging_dir(fold: _Fold, alias: str, value: Any) -> None:
    fold.attributes["logging_dir"] = os.path.expanduser(os.fspath(value))


def _use_mps_device(fold: _Fold, alias: str, value: Any) -> None:
    import torch

    mps = getattr(torch.backends, "mps", None)
    if value and not (mps is not None and mps.is_available()):
        _refuse(
            alias,
            value,
            "this machine has no MPS device; remove `use_mps_device` (MPS is picked automatically).",
        )


def _fp16_opt_level(fold: _Fold, alias: str, value: Any) -> None:
    if value != "O1":
        _refuse(alias, value, "apex AMP is gone in v5; native autocast is used. Remove `fp16_opt_level`.")


def _half_precision_backend(fold: _Fold, alias: str, value: Any) -> None:
    if value not in ("auto", "cuda_amp", "cpu_amp"):
        _refuse(
            alias, value, "apex is gone in v5; only native autocast remains. Use `fp16=True` or `bf16=True`."
        )


def _tpu_metrics_debug(fold: _Fold, alias: str, value: Any) -> None:
    debug = fold.kwargs.get("debug", "")
    if debug is None:
        debug = ""
    if isinstance(debug, str):
        words = debug.split()
        fold.kwargs["debug"] = (
            " ".join([*words, "tpu_metrics_debug"]) if "tpu_metrics_debug" not in words else debug
        )
    elif "tpu_metrics_debug" not in debug:
        fold.kwargs["debug"] = [*debug, "tpu_metrics_debug"]


_SHARDED_DDP_WHY = (
    "FairScale sharded DDP is gone. Nearest v5 setups: zero_dp_2 ~ `fsdp=True, fsdp_config="
    '{"reshard_after_forward": False}`, zero_dp_3 ~ `fsdp=True`, offload ~ `fsdp_config={"cpu_offload": True}`.'
)


def _fsdp_min_num_params(fold: _Fold, alias: str, value: Any) -> None:
    fold.set_dict_key(alias, "fsdp_config", "min_num_params", value)
    # v4 switched to size-based wrapping by itself; v5 only reads min_num_params with that policy.
    fold.set_dict_key(alias, "fsdp_config", "auto_wrap_policy", "SIZE_BASED_WRAP")


def _fsdp_layer_cls(fold: _Fold, alias: str, value: Any) -> None:
    fold.set_dict_key(
        alias, "fsdp_config", "transformer_layer_cls_to_wrap", [value] if isinstance(value, str) else value
    )


def _optim_if_true(optim_name: str) -> Callable[[_Fold, str, Any], None]:
    def handler(fold: _Fold, alias: str, value: Any) -> None:
        if value:
            fold.set_field(alias, "optim", optim_name)

    return handler


def _group_by_length(fold: _Fold, alias: str, value: Any) -> None:
    if value:
        fold.set_field(alias, "train_sampling_strategy", "group_by_length")


def _hub_model_id(fold: _Fold, alias: str, value: Any) -> None:
    organization = fold.aliases.get("push_to_hub_organization")
    fold.set_field(alias, "hub_model_id", f"{organization}/{value}" if organization else value)


def _hub_organization(fold: _Fold, alias: str, value: Any) -> None:
    if fold.aliases.get("push_to_hub_model_id") is not None:
        return  # combined by _hub_model_id
    output_dir = fold.kwargs.get("output_dir") or "trainer_output"
    fold.set_field(alias, "hub_model_id", f"{value}/{Path(output_dir).name}")


def _include_inputs(fold: _Fold, alias: str, value: Any) -> None:
    if value:
        current = list(fold.kwargs.get("include_for_metrics") or [])
        fold.kwargs["include_for_metrics"] = current if "inputs" in current else [*current, "inputs"]


def _torchdynamo(fold: _Fold, alias: str, value: Any) -> None:
    fold.set_field(alias, "torch_compile_backend", value)


def _ray_scope(fold: _Fold, alias: str, value: Any) -> None:
    os.environ["RAY_SCOPE"] = str(value)  # read by the Ray search backend


def _tokens_per_second(fold: _Fold, alias: str, value: Any) -> None:
    if value and fold.kwargs.get("include_num_input_tokens_seen", "no") in ("no", False):
        fold.kwargs["include_num_input_tokens_seen"] = "all"


def _accelerator_key(key: str) -> Callable[[_Fold, str, Any], None]:
    def handler(fold: _Fold, alias: str, value: Any) -> None:
        fold.set_dict_key(alias, "accelerator_config", key, value)

    return handler


# v4 name -> (values that mean "not set" in v4, v5 replacement shown in the warning, handler).
V4_ALIASES: dict[str, tuple[tuple[Any, ...], str, Callable[[_Fold, str, Any], None]]] = {
    "evaluation_strategy": ((None, "no"), "eval_strategy", _rename("eval_strategy")),
    "per_gpu_train_batch_size": (
        (None,),
        "per_device_train_batch_size",
        _rename("per_device_train_batch_size"),
    ),
    "per_gpu_eval_batch_size": ((None,), "per_device_eval_batch_size", _rename("per_device_eval_batch_size")),
    "warmup_ratio": ((None, 0, 0.0), "warmup_steps (a float in [0, 1) is a ratio)", _warmup_ratio),
    "logging_dir": ((None,), "env TENSORBOARD_LOGGING_DIR", _logging_dir),
    "no_cuda": ((None, False), "use_cpu", _rename("use_cpu")),
    "use_mps_device": ((None, False), "nothing (MPS is picked automatically)", _use_mps_device),
    "fp16_opt_level": ((None,), "nothing (native autocast)", _fp16_opt_level),
    "half_precision_backend": ((None,), "nothing (native autocast)", _half_precision_backend),
    "fp16_backend": ((None,), "nothing (native autocast)", _half_precision_backend),
    "xpu_backend": ((None,), "ddp_backend", _rename("ddp_backend")),
    "tpu_num_cores": ((None,), "nothing (the launcher decides)", _no_op),
    "tpu_metrics_debug": ((None, False), 'debug="tpu_metrics_debug"', _tpu_metrics_debug),
    "past_index": (
        (None, -1),
        "nothing (mems/past feeding no longer exists)",
        _refuse_set("only -1 is accepted."),
    ),
    "sharded_ddp": ((None, False, "", []), "fsdp", _refuse_set(_SHARDED_DDP_WHY)),
    "fsdp_min_num_params": ((None, 0), "fsdp_config['min_num_params']", _fsdp_min_num_params),
    "fsdp_transformer_layer_cls_to_wrap": (
        (None,),
        "fsdp_config['transformer_layer_cls_to_wrap']",
        _fsdp_layer_cls,
    ),
    "adafactor": ((None, False), 'optim="adafactor"', _optim_if_true("adafactor")),
    "group_by_length": ((None, False), 'train_sampling_strategy="group_by_length"', _group_by_length),
    "overwrite_output_dir": ((), "nothing (it was only read by scripts)", _no_op),
    "push_to_hub_model_id": ((None,), "hub_model_id", _hub_model_id),
    "push_to_hub_organization": ((None,), "hub_model_id", _hub_organization),
    "push_to_hub_token": ((None, "<PUSH_TO_HUB_TOKEN>"), "hub_token", _rename("hub_token")),
    "include_inputs_for_metrics": ((None, False), 'include_for_metrics=["inputs"]', _include_inputs),
    "use_legacy_prediction_loop": (
        (None, False),
        "nothing",
        _refuse_set("the legacy prediction loop is gone; remove `use_legacy_prediction_loop`."),
    ),
    "mp_parameters": (
        (None, ""),
        "nothing",
        _refuse_set("SageMaker model parallelism is gone; remove `mp_parameters`."),
    ),
    "torchdynamo": ((None,), "torch_compile_backend", _torchdynamo),
    "ray_scope": ((None, "last"), "env RAY_SCOPE", _ray_scope),
    "jit_mode_eval": (
        (None, False),
        "nothing",
        _refuse_set("TorchScript evaluation is gone; use `torch_compile`."),
    ),
    "use_ipex": ((None, False), "nothing", _refuse_set("IPEX support is gone; remove `use_ipex`.")),
    "save_safetensors": (
        (None, True),
        "nothing (always safetensors)",
        _refuse_set("checkpoints are always safetensors; remove `save_safetensors`."),
    ),
    "include_tokens_per_second": (
        (None, False),
        'include_num_input_tokens_seen="all"',
        _tokens_per_second,
    ),
    "split_batches": (
        (None, False),
        "accelerator_config['split_batches']",
        _accelerator_key("split_batches"),
    ),
    "dispatch_batches": (
        (None,),
        "accelerator_config['dispatch_batches']",
        _accelerator_key("dispatch_batches"),
    ),
}

# Removed values of a v5 field: value -> (replacement, why).
_OPTIM_VALUES = {
    "adamw_hf": (
        "adamw_torch",
        "the closest match (the old class applied weight decay after the Adam update, torch applies it before)",
    ),
    "adamw_apex_fused": ("adamw_torch_fused", "apex is gone"),
}


def _is_unset(value: Any, unset_values: tuple[Any, ...]) -> bool:
    return any(value is u or (type(value) is type(u) and value == u) for u in unset_values)


def fold_v4_aliases(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Translate v4 keywords in ``kwargs``; return (keywords for the dataclass, non-field attributes)."""
    aliases = {name: kwargs[name] for name in V4_ALIASES if name in kwargs}
    fold = _Fold({k: v for k, v in kwargs.items() if k not in aliases}, aliases)
    for alias, value in aliases.items():
        unset_values, replacement, handler = V4_ALIASES[alias]
        warnings.warn(
            f"`{alias}` is a transformers v4 argument; hf_lightning translates it to {replacement}. "
            "Use the v5 name instead.",
            FutureWarning,
            stacklevel=user_stacklevel(),
        )
        if not _is_unset(value, unset_values):
            handler(fold, alias, value)

    optim = fold.kwargs.get("optim")
    if isinstance(optim, str) and optim in _OPTIM_VALUES:
        replacement, why = _OPTIM_VALUES[optim]
        warnings.warn(
            f'`optim="{optim}"` was removed in transformers v5; using "{replacement}" ({why}).',
            FutureWarning,
            stacklevel=user_stacklevel(),
        )
        fold.kwargs["optim"] = replacement
    if "report_to" in fold.kwargs and fold.kwargs["report_to"] is None:
        raise ValueError(
            '`report_to=None` is ambiguous (v4 meant "all installed integrations", v5 fails on it). '
            'Pass `report_to="all"` or `report_to="none"`.'
        )
    return fold.kwargs, fold.attributes


def _refuse_unknown_keywords(class_name: str, kwargs: dict[str, Any], init_names: list[str]) -> None:
    """The TypeError Python raises for an unknown keyword, with the closest field suggested (typos)."""
    import difflib

    for name in kwargs:
        if name not in init_names:
            close = difflib.get_close_matches(name, init_names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"{class_name}.__init__() got an unexpected keyword argument {name!r}{hint}")


def with_v4_aliases(cls: C) -> C:
    """Wrap the dataclass ``__init__`` of ``cls`` so that it accepts the v4 keywords.

    ``inspect.signature(cls)`` still shows only the v5 fields (the wrapper exposes ``__wrapped__``).
    Apply it to every dataclass subclass too: ``@dataclass`` generates a fresh ``__init__``.
    """
    original_init = cls.__init__
    init_names = [f.name for f in fields(cls) if f.init]

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(init_names):
            raise TypeError(
                f"{cls.__name__}.__init__() takes {len(init_names) + 1} positional arguments "
                f"but {len(args) + 1} were given"
            )
        merged = dict(kwargs)
        for name, value in zip(init_names, args):
            if name in merged:
                raise TypeError(f"{cls.__name__}.__init__() got multiple values for argument '{name}'")
            merged[name] = value
        field_kwargs, attributes = fold_v4_aliases(merged)
        _refuse_unknown_keywords(cls.__name__, field_kwargs, init_names)
        for name, value in attributes.items():
            object.__setattr__(self, name, value)
        original_init(self, **field_kwargs)

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls
