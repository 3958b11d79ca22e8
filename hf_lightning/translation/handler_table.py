"""The handler table: every `TrainingArguments` / `Seq2SeqTrainingArguments` field exactly once,
mapped to the entry whose handler says how it is honoured or why it is refused.

Handlers live in `hf_lightning/translation/handlers/`, grouped by theme.
"""

from __future__ import annotations

from hf_lightning.translation.handlers import distributed, evaluation, reporting, system, training
from hf_lightning.translation.handlers.core import FieldEntry, Handler


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

# The fields a plan section carries: field -> (section, key), as each entry declares (`FieldEntry.carries`). Its
# component reads the value there; no code outside args/ and translation/ reads these fields on the arguments
# (tests/architecture/test_plan_only_reads.py).
CARRIED_FIELDS: dict[str, tuple[str, str]] = {
    name: entry.carries for name, entry in FIELD_REGISTRY.items() if entry.carries is not None
}
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
