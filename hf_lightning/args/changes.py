"""Arguments changed after the trainer was built: what `train()` reads of them.

Libraries rewrite the arguments of a trainer they built (setfit sets about twenty fields of its sentence-transformers
trainer's arguments after construction). The reference reads most fields when training starts, and a few only in its
constructor (the batch size it keeps as `_train_batch_size`, the accelerator's precision and process options, the
callbacks `report_to` / `disable_tqdm` choose, the Hub repository, the label smoother...). `train()` therefore
translates the arguments again when a field changed (the run reads the new value, and a value the translation
refuses is refused before training, naming the field), except the fields below, which keep their value at
construction, as the reference's do, with a warning that names each one: never a stale plan in silence.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from typing import Any

# Fields the reference reads only in its constructor -> what it built from them there.
CONSTRUCTION_FIELDS: dict[str, str] = {
    "per_device_train_batch_size": "the train batch size it keeps as `_train_batch_size`",
    "fp16": "the accelerator's mixed precision",
    "bf16": "the accelerator's mixed precision",
    "accelerator_config": "the accelerator's dataloader options",
    "deepspeed": "the accelerator's DeepSpeed plugin",
    "fsdp": "the accelerator's FSDP plugin",
    "fsdp_config": "the accelerator's FSDP plugin",
    "parallelism_config": "the accelerator's parallelism",
    "ddp_find_unused_parameters": "the accelerator's DDP options",
    "ddp_bucket_cap_mb": "the accelerator's DDP options",
    "ddp_broadcast_buffers": "the accelerator's DDP options",
    "ddp_static_graph": "the accelerator's DDP options",
    "ddp_backend": "the process group",
    "ddp_timeout": "the process group",
    "use_cpu": "the device",
    "torch_compile": "the accelerator's compilation plugin",
    "torch_compile_backend": "the accelerator's compilation plugin",
    "torch_compile_mode": "the accelerator's compilation plugin",
    "seed": "the seeding at construction",
    "full_determinism": "the seeding at construction",
    "report_to": "the logging integrations",
    "disable_tqdm": "the progress callback",
    "enable_jit_checkpoint": "the SIGTERM checkpoint callback",
    "push_to_hub": "the Hub repository",
    "hub_model_id": "the Hub repository",
    "hub_token": "the Hub repository",
    "hub_private_repo": "the Hub repository",
    "log_level": "the library's log level",
    "log_level_replica": "the library's log level",
    "place_model_on_device": "the model's placement",
    "fp16_full_eval": "the model's placement",
    "bf16_full_eval": "the model's placement",
    "label_names": "the trainer's `label_names`",
    "label_smoothing_factor": "the trainer's `label_smoother`",
    "neftune_noise_alpha": "the trainer's `neftune_noise_alpha`",
    "skip_memory_metrics": "the memory tracker",
    "use_cache": "the model config's `use_cache`",
}


def arguments_snapshot(args: Any) -> dict[str, Any]:
    """Every field's value now (mutable values copied, so a change in place is seen)."""
    snapshot = {}
    for field in dataclasses.fields(args):
        value = getattr(args, field.name, None)
        try:
            snapshot[field.name] = copy.deepcopy(value)
        except Exception:  # an object that cannot be copied (a callable's closure, a lock): compared by identity
            snapshot[field.name] = value
    return snapshot


def changed_fields(before: dict[str, Any], args: Any) -> list[str]:
    """The fields whose value differs from `before`, in the arguments' order."""
    changed = []
    for field in dataclasses.fields(args):
        now = getattr(args, field.name, None)
        then = before.get(field.name, now)
        try:
            same = bool(now == then)
        except Exception:
            same = now is then
        if not same:
            changed.append(field.name)
    return changed


def warn_kept(names: list[str], before: dict[str, Any], args: Any) -> None:
    """One warning naming each construction field that changed, and the value the run keeps."""
    for name in names:
        warnings.warn(
            f"TrainingArguments.{name} changed after the trainer was built ({before[name]!r} -> "
            f"{getattr(args, name)!r}); transformers.Trainer reads it only in its constructor "
            f"({CONSTRUCTION_FIELDS[name]}), so train() keeps {before[name]!r}, as it does. Set it before building "
            "the trainer to use the new value.",
            UserWarning,
            stacklevel=4,
        )


def with_construction_values(args: Any, before: dict[str, Any], names: list[str]) -> Any:
    """A shallow copy of `args` whose `names` hold their construction values (what the translation reads)."""
    view = copy.copy(args)
    for name in names:
        object.__setattr__(view, name, before[name])
    return view
