"""A stock TRL config (or a transformers `TrainingArguments`, where TRL converts one) given to a rebuilt trainer.

A script migrating from trl keeps its `trl.SFTConfig(...)`: the rebuilt trainer's `__init__` first reads it field
by field into the rebuilt config of the same kind (same values), then runs TRL's `__init__` with that.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import transformers
from trl.trainer.base_config import _BaseConfig

from hf_lightning.args.training_args import TrainingArguments, fields_into

# GRPO's and RLOO's __post_init__ derive generation_batch_size from steps_per_generation (or the reverse) and
# refuse both set; the copy carries steps_per_generation and lets ours derive the other, to the same value.
_DERIVED = {"generation_batch_size": "steps_per_generation"}


def as_our_config(args: Any, trainer: str, stock: type, ours: type, converts_training_arguments: bool) -> Any:
    """`args` as the rebuilt config `ours` when it is stock TRL's `stock` (or, for a trainer whose TRL
    `__init__` converts one, a transformers `TrainingArguments`); ours and `None` as given.

    A stock TRL config of another kind, or a `TrainingArguments` where TRL takes none, is refused by name."""
    if args is None or isinstance(args, TrainingArguments):
        return args
    if isinstance(args, stock):
        names = {f for f in ours.__dataclass_fields__}
        leave_out = frozenset(f for f, source in _DERIVED.items() if f in names and source in names)
        return fields_into(args, ours, trainer, leave_out=leave_out, stacklevel=4)
    if isinstance(args, _BaseConfig):
        raise TypeError(
            f"args: {trainer} takes a {ours.__name__}; got trl's {type(args).__name__}. "
            f"Build hf_lightning.trl.{ours.__name__}(...) (or trl.{ours.__name__}(...)) instead."
        )
    if isinstance(args, transformers.TrainingArguments):
        if converts_training_arguments:
            # As TRL's own SFTTrainer.__init__, which rebuilds its config from the TrainingArguments' values
            # (`args.to_dict()`): the given fields, the config's defaults for the rest.
            return fields_into(args, ours, trainer, stacklevel=4)
        raise TypeError(
            f"args: {trainer} takes a {ours.__name__}, not a transformers TrainingArguments (trl's {trainer} does "
            f"not convert one either). Build hf_lightning.trl.{ours.__name__}(...) with the same fields."
        )
    return args


def accepting_stock_configs(
    init: Callable[..., None], trainer: str, stock: type, ours: type, converts_training_arguments: bool
) -> Callable[..., None]:
    """TRL's `__init__` (`init`, kept as `__wrapped__`) run with its `args` passed through `as_our_config`."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(*positional: Any, **keywords: Any) -> None:
        bound = signature.bind(*positional, **keywords)
        if "args" in bound.arguments:
            bound.arguments["args"] = as_our_config(
                bound.arguments["args"], trainer, stock, ours, converts_training_arguments
            )
        init(*bound.args, **bound.kwargs)

    return __init__
