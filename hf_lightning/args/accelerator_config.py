"""``AcceleratorConfig``: the reference's ``accelerator_config`` block, without depending on accelerate.

The data-related keys (``split_batches``, ``even_batches``, ``use_seedable_sampler``, ...) change how
batches are dealt to processes; hf_lightning's data layer reads them from this object.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["AcceleratorConfig", "write_planned_accumulation", "to_accelerator_config"]


@dataclass
class AcceleratorConfig:
    """Data-loading and gradient-accumulation options the reference hands to ``accelerate.Accelerator``."""

    split_batches: bool = field(
        default=False,
        metadata={
            "help": "Whether or not the accelerator should split the batches yielded by the dataloaders across the devices. If"
            " `True` the actual batch size used will be the same on any kind of distributed processes, but it must be a"
            " round multiple of the `num_processes` you are using. If `False`, actual batch size used will be the one set"
            " in your script multiplied by the number of processes."
        },
    )
    dispatch_batches: bool | None = field(
        default=None,
        metadata={
            "help": "If set to `True`, the dataloader is only iterated through on the main process and then the batches"
            " are split and broadcast to each process. Will default to `True` for `DataLoader` whose underlying dataset"
            " is an `IterableDataset`, `False` otherwise."
        },
    )
    even_batches: bool = field(
        default=True,
        metadata={
            "help": "If set to `True`, in cases where the total batch size across all processes does not exactly divide the"
            " dataset, samples at the start of the dataset will be duplicated so the batch can be divided equally among"
            " all workers."
        },
    )
    use_seedable_sampler: bool = field(
        default=True,
        metadata={
            "help": "Whether or not use a fully seedable random sampler. Ensures training results are fully reproducible"
            " using a different sampling technique."
        },
    )
    non_blocking: bool = field(
        default=False,
        metadata={
            "help": "Whether to use non-blocking device copies of the prepared `DataLoader` inputs. Best if used with"
            " `pin_memory=True` in the `TrainingArguments`."
        },
    )
    gradient_accumulation_kwargs: dict | None = field(
        default=None,
        metadata={
            "help": "Additional kwargs to configure gradient accumulation. Optional keys: `num_steps` (int, takes precedence"
            " over `gradient_accumulation_steps` if the latter is 1, otherwise an error is raised) and `sync_each_batch`"
            " (bool, synchronize the gradients at each data batch)."
        },
    )
    use_configured_state: bool = field(
        default=False,
        metadata={
            "help": "Whether or not to use a pre-configured `AcceleratorState` or `PartialState` defined before calling"
            " `TrainingArguments` (not supported by hf_lightning: Lightning sets up the processes)."
        },
    )

    @classmethod
    def from_json_file(cls, json_file: str | os.PathLike) -> AcceleratorConfig:
        """Load from a JSON file; unknown keys raise ``ValueError`` (as the reference does)."""
        with open(json_file, encoding="utf-8") as f:
            config_dict = json.load(f)
        extra_keys = sorted(key for key in config_dict if key not in cls.__dataclass_fields__)
        if extra_keys:
            raise ValueError(
                f"accelerator_config: the config file at {json_file} had unknown keys ({extra_keys}); valid keys are "
                f"{[f.name for f in fields(cls)]}. Remove or rename them."
            )
        return cls(**config_dict)

    def to_dict(self) -> dict[str, Any]:
        """A deep copy of the instance dictionary (after ``pop`` it lacks the popped keys, like the reference)."""
        return copy.deepcopy(self.__dict__)

    def pop(self, key: str, default: Any = None) -> Any:
        """Remove ``key`` from the instance dictionary (the reference pops ``use_configured_state`` this way)."""
        return self.__dict__.pop(key, default)


def to_accelerator_config(value: Any) -> AcceleratorConfig:
    """Normalise ``accelerator_config`` (None, dict, JSON path or instance) into an ``AcceleratorConfig``."""
    if isinstance(value, AcceleratorConfig):
        return value
    if value is None:
        return AcceleratorConfig()
    if isinstance(value, type):
        # The reference refuses an uninstantiated class with NotImplementedError; keep the type.
        raise NotImplementedError(
            "Tried passing in a callable to `accelerator_config`, but this is not supported. "
            "Please pass in a fully constructed `AcceleratorConfig` object instead."
        )
    if isinstance(value, dict):
        unknown = sorted(k for k in value if k not in AcceleratorConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"accelerator_config: unknown keys {unknown}; valid keys are "
                f"{[f.name for f in fields(AcceleratorConfig)]}. Remove or rename them."
            )
        return AcceleratorConfig(**value)
    if _looks_like_foreign_accelerator_config(value):
        # A transformers.trainer_pt_utils.AcceleratorConfig (or similar): copy its fields.
        return to_accelerator_config(dict(value.to_dict()))
    if isinstance(value, (str, os.PathLike)):
        return AcceleratorConfig.from_json_file(value)
    raise ValueError(
        f"accelerator_config: got a {type(value).__name__}; pass a dict, a path to a JSON file, or an "
        "AcceleratorConfig instance."
    )


def _looks_like_foreign_accelerator_config(value: Any) -> bool:
    """True for an AcceleratorConfig of another package (duck-typed: same class name and a ``to_dict``)."""
    return type(value).__name__ == "AcceleratorConfig" and callable(getattr(value, "to_dict", None))


def write_planned_accumulation(args: Any, planned_steps: int) -> None:
    """What the reference's trainer writes into its arguments when it is built: with `num_steps` in
    `gradient_accumulation_kwargs` (allowed only with `gradient_accumulation_steps=1`), the accumulation window the
    translation planned from it (`plan.module.gradient_accumulation_steps`, the one place it is folded) becomes
    `args.gradient_accumulation_steps`, and the kwargs then say `num_steps=1`, since the trainer, not accelerate,
    accumulates. `trainer.args`, `training_args.bin` and a later trainer on the same arguments therefore see what
    they see under the reference (which refuses `num_steps` next to a window > 1)."""
    config = getattr(args, "accelerator_config", None)
    if isinstance(config, Mapping):
        kwargs = config.get("gradient_accumulation_kwargs")
    else:
        kwargs = getattr(config, "gradient_accumulation_kwargs", None)
    if kwargs is None:
        return
    if "num_steps" in kwargs:
        args.gradient_accumulation_steps = planned_steps
    kwargs["num_steps"] = 1
