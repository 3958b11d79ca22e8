"""The transformers v4 command-line flags that ``HfArgumentParser`` accepts for hf_lightning's arguments.

transformers 5.24 dropped these fields, so its parser rejects ``--evaluation_strategy`` & co. Our
``TrainingArguments`` constructor still takes the v4 names and folds them into the v5 fields
(``hf_lightning.args.aliases``), so an old script's command line keeps working. Each flag has the
argument shape it had in transformers v4 (type, ``--flag`` alone for bools, ``--no_save_safetensors``)
and reaches the constructor only when given, so an absent flag never warns.
"""

from __future__ import annotations

import dataclasses
from argparse import ArgumentParser
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from hf_lightning.args.aliases import V4_ALIASES

__all__ = ["V4_GROUP_TITLE", "add_v4_alias_arguments", "v4_alias_names"]

V4_GROUP_TITLE = "transformers v4 names (deprecated; translated to the v5 arguments)"


def _v4(default: Any = None) -> Any:
    return field(default=default)


@dataclass
class _V4Flags:
    """The v4 fields that v5 removed, with their v4 types and defaults (help comes from ``V4_ALIASES``)."""

    evaluation_strategy: str | None = _v4()
    per_gpu_train_batch_size: int | None = _v4()
    per_gpu_eval_batch_size: int | None = _v4()
    warmup_ratio: float = _v4(0.0)
    logging_dir: str | None = _v4()
    no_cuda: bool = _v4(False)
    use_mps_device: bool = _v4(False)
    fp16_opt_level: str = _v4("O1")
    half_precision_backend: str = _v4("auto")
    fp16_backend: str = _v4("auto")
    xpu_backend: str | None = _v4()
    tpu_num_cores: int | None = _v4()
    tpu_metrics_debug: bool = _v4(False)
    past_index: int = _v4(-1)
    # v4 typed it `list[ShardedDDPOption] | str`: several words after the flag.
    sharded_ddp: list[str] = field(default_factory=list)
    fsdp_min_num_params: int = _v4(0)
    fsdp_transformer_layer_cls_to_wrap: str | None = _v4()
    adafactor: bool = _v4(False)
    group_by_length: bool = _v4(False)
    overwrite_output_dir: bool = _v4(False)
    push_to_hub_model_id: str | None = _v4()
    push_to_hub_organization: str | None = _v4()
    push_to_hub_token: str | None = _v4()
    include_inputs_for_metrics: bool = _v4(False)
    use_legacy_prediction_loop: bool = _v4(False)
    mp_parameters: str = _v4("")
    torchdynamo: str | None = _v4()
    ray_scope: str | None = _v4("last")
    jit_mode_eval: bool = _v4(False)
    use_ipex: bool = _v4(False)
    save_safetensors: bool | None = _v4(True)
    include_tokens_per_second: bool | None = _v4(False)
    split_batches: bool | None = _v4()
    dispatch_batches: bool | None = _v4()


def v4_alias_names() -> set[str]:
    """Names of the v4 flags (each one a keyword of our ``TrainingArguments`` constructor)."""
    return {f.name for f in dataclasses.fields(_V4Flags)}


def add_v4_alias_arguments(
    parser: ArgumentParser, add_field: Callable[[Any, dataclasses.Field, Any], None]
) -> None:
    """Add the v4 flags to ``parser`` in their own help group; ``add_field(group, field, type)`` adds one."""
    group = parser.add_argument_group(V4_GROUP_TITLE)
    hints = get_type_hints(_V4Flags)
    for f in dataclasses.fields(_V4Flags):
        replacement = V4_ALIASES[f.name][1]
        help_field = dataclasses.field(
            default=f.default,
            default_factory=f.default_factory,
            metadata={"help": f"transformers v4 name, translated to {replacement}."},
        )
        help_field.name = f.name
        add_field(group, help_field, hints[f.name])
