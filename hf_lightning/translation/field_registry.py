"""The field registry: every `TrainingArguments` / `Seq2SeqTrainingArguments` field exactly once,
mapped to the handler that says how it is honoured or why it is refused.

Handlers live in `hf_lightning/translation/registry/`, grouped by theme.
"""

from __future__ import annotations

import dataclasses

from hf_lightning.translation.registry import distributed, evaluation, reporting, system, training
from hf_lightning.translation.registry.core import FieldEntry, Handler, carried


def _build(*groups: list[FieldEntry]) -> dict[str, FieldEntry]:
    registry: dict[str, FieldEntry] = {}
    for group in groups:
        for entry in group:
            if entry.name in registry:
                raise RuntimeError(f"field {entry.name!r} is registered twice")
            registry[entry.name] = entry
    return registry


# In the reference's field order (R1.1).
TRAINING_ARGUMENTS_REGISTRY: dict[str, FieldEntry] = _build(
    training.ENTRIES,
    reporting.ENTRIES,
    evaluation.ENTRIES,
    system.ENTRIES,
    distributed.ENTRIES,
    system.TAIL_ENTRIES,
)
SEQ2SEQ_REGISTRY: dict[str, FieldEntry] = _build(evaluation.SEQ2SEQ_ENTRIES)
FIELD_REGISTRY: dict[str, FieldEntry] = _build(
    list(TRAINING_ARGUMENTS_REGISTRY.values()), list(SEQ2SEQ_REGISTRY.values())
)

# The fields a plan section carries: field -> (section, key). Its component reads the value there; no code outside
# args/ and translation/ reads these fields on the arguments (tests/architecture/test_plan_only_reads.py).
CARRIED_FIELDS: dict[str, tuple[str, str]] = {
    "eval_on_start": ("evaluation", "on_start"),
    "prediction_loss_only": ("evaluation", "prediction_loss_only"),
    "eval_accumulation_steps": ("evaluation", "accumulation_steps"),
    "eval_do_concat_batches": ("evaluation", "do_concat_batches"),
    "eval_use_gather_object": ("evaluation", "use_gather_object"),
    "batch_eval_metrics": ("evaluation", "batch_eval_metrics"),
    "include_for_metrics": ("evaluation", "include_for_metrics"),
    "fp16_full_eval": ("evaluation", "fp16_full_eval"),
    "bf16_full_eval": ("evaluation", "bf16_full_eval"),
    "save_strategy": ("checkpointing", "save_strategy"),
    "save_total_limit": ("checkpointing", "save_total_limit"),
    "save_only_model": ("checkpointing", "save_only_model"),
    "metric_for_best_model": ("checkpointing", "metric_for_best_model"),
    "greater_is_better": ("checkpointing", "greater_is_better"),
    "load_best_model_at_end": ("checkpointing", "load_best_model_at_end"),
    "restore_callback_states_from_checkpoint": ("checkpointing", "restore_callback_states_from_checkpoint"),
    "ignore_data_skip": ("checkpointing", "ignore_data_skip"),
    "logging_nan_inf_filter": ("logging", "nan_inf_filter"),
    "push_to_hub": ("hub", "push_to_hub"),
    "hub_model_id": ("hub", "model_id"),
    "hub_strategy": ("hub", "strategy"),
    "hub_private_repo": ("hub", "private_repo"),
    "hub_always_push": ("hub", "always_push"),
    "hub_revision": ("hub", "revision"),
}
for _name, (_section, _key) in CARRIED_FIELDS.items():
    _entry = FIELD_REGISTRY[_name]
    FIELD_REGISTRY[_name] = dataclasses.replace(_entry, handler=carried(_section, _key, _entry.handler))
# The mapping table field name -> handler function.
FIELD_HANDLERS: dict[str, Handler] = {name: entry.handler for name, entry in FIELD_REGISTRY.items()}


def registry_markdown() -> str:
    """The README table of arguments: field, default, support, and how it is honoured or why not."""
    lines = [
        "| field | default | supported | how it is honoured / why refused |",
        "|---|---|---|---|",
    ]
    for name, entry in FIELD_REGISTRY.items():
        doc = entry.doc.replace("|", "\\|")
        support = entry.support if entry.support is not None else "yes"
        lines.append(f"| `{name}` | `{entry.default!r}` | {support} | {doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(registry_markdown(), end="")
