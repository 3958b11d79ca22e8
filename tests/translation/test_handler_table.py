"""The handler table covers every reference field exactly once, with the reference's defaults."""

from __future__ import annotations

import dataclasses

import pytest
import transformers

import hf_lightning.translation.handler_table as handler_table
from hf_lightning.translation.handler_table import (
    FIELD_HANDLERS,
    FIELD_REGISTRY,
    SEQ2SEQ_REGISTRY,
    TRAINING_ARGUMENTS_REGISTRY,
    registry_markdown,
)
from hf_lightning.translation.handlers import distributed, evaluation, reporting, system, training
from hf_lightning.translation.handlers.core import STATUSES, FieldEntry, always

REFERENCE_FIELDS = [f.name for f in dataclasses.fields(transformers.TrainingArguments)]
REFERENCE_SEQ2SEQ_FIELDS = [f.name for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments)]
ALL_GROUPS = [
    training.ENTRIES,
    reporting.ENTRIES,
    evaluation.ENTRIES,
    system.ENTRIES,
    distributed.ENTRIES,
    system.TAIL_ENTRIES,
    evaluation.SEQ2SEQ_ENTRIES,
]


def test_every_training_arguments_field_is_registered_in_the_reference_order():
    assert len(REFERENCE_FIELDS) == 114
    missing = [name for name in REFERENCE_FIELDS if name not in TRAINING_ARGUMENTS_REGISTRY]
    extra = [name for name in TRAINING_ARGUMENTS_REGISTRY if name not in REFERENCE_FIELDS]
    assert missing == [] and extra == []
    assert list(TRAINING_ARGUMENTS_REGISTRY) == REFERENCE_FIELDS


def test_every_seq2seq_field_is_registered():
    assert len(REFERENCE_SEQ2SEQ_FIELDS) == 119
    assert list(FIELD_REGISTRY) == REFERENCE_SEQ2SEQ_FIELDS
    assert list(SEQ2SEQ_REGISTRY) == REFERENCE_SEQ2SEQ_FIELDS[114:]


def test_each_field_is_registered_exactly_once_across_the_theme_modules():
    names = [entry.name for group in ALL_GROUPS for entry in group]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    assert duplicates == []
    assert len(names) == len(FIELD_REGISTRY) == 119


def test_registering_a_field_twice_is_an_error():
    entry = FieldEntry("seed", 42, always("x"), "doc")
    with pytest.raises(RuntimeError, match="seed"):
        handler_table._build([entry], [entry])


def test_handler_table_maps_every_field_to_a_callable():
    assert list(FIELD_HANDLERS) == list(FIELD_REGISTRY)
    assert all(callable(handler) for handler in FIELD_HANDLERS.values())


def _reference_default(cls, name):
    field = {f.name: f for f in dataclasses.fields(cls)}[name]
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory()


@pytest.mark.parametrize("name", REFERENCE_SEQ2SEQ_FIELDS)
def test_registry_default_is_the_reference_default(name):
    reference = _reference_default(transformers.Seq2SeqTrainingArguments, name)
    assert FIELD_REGISTRY[name].default == getattr(reference, "value", reference)


def test_registry_markdown_has_one_row_per_field():
    table = registry_markdown()
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == list(FIELD_REGISTRY)
    assert next(row for row in rows if row.startswith("| `enable_jit_checkpoint`")).split("|")[3].strip() == "yes"
    assert next(row for row in rows if row.startswith("| `push_to_hub`")).split("|")[3].strip() == "yes"
    assert next(row for row in rows if row.startswith("| `seed`")).split("|")[3].strip() == "yes"


def test_statuses_are_the_four_documented_ones():
    assert STATUSES == ("honoured", "refused", "warned", "not-applicable")
