"""Collation against transformers' collators, quirks included (R3.10, R3.11)."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
import torch
import transformers
from transformers.data.data_collator import DataCollatorWithPadding as RefDataCollatorWithPadding
from transformers.trainer_utils import RemoveColumnsCollator as RefRemoveColumnsCollator

from hf_lightning.data.collate import (
    DataCollatorWithPadding,
    RemoveColumnsCollator,
    default_data_collator,
    pick_default_collator,
)


@dataclasses.dataclass
class Example:
    input_ids: list
    label: int


def _assert_same_batch(ours: dict, ref: dict) -> None:
    assert list(ours) == list(ref)
    for key in ref:
        assert ours[key].dtype == ref[key].dtype, key
        assert torch.equal(ours[key], ref[key]), key


SAME_AS_REFERENCE = {
    "spec_example": [
        {"a": [1, 2], "label": 1, "s": "x", "n": None},
        {"a": [3, 4], "label": 0, "s": "y", "n": None},
    ],
    "float_labels": [{"a": [1], "label": 0.5}, {"a": [2], "label": 1.5}],
    "numpy_int_label": [{"a": [1], "label": np.int64(3)}, {"a": [2], "label": np.int64(1)}],
    "tensor_0d_int_label": [{"a": [1], "label": torch.tensor(2)}, {"a": [2], "label": torch.tensor(0)}],
    "tensor_0d_float_label": [{"a": [1], "label": torch.tensor(2.5)}, {"a": [2], "label": torch.tensor(0.5)}],
    "label_ids_ints": [{"a": [1], "label_ids": [1, 2]}, {"a": [2], "label_ids": [3, 4]}],
    "label_ids_floats": [{"a": [1], "label_ids": [0.1, 2]}, {"a": [2], "label_ids": [3.0, 4]}],
    "label_ids_tensors": [{"label_ids": torch.tensor([1, 2])}, {"label_ids": torch.tensor([3, 4])}],
    "label_none_uses_label_ids": [{"label": None, "label_ids": [1]}, {"label": None, "label_ids": [2]}],
    "label_beats_label_ids": [{"label": 1, "label_ids": [5]}, {"label": 0, "label_ids": [6]}],
    "tensors_stacked": [{"x": torch.ones(2, 3)}, {"x": torch.zeros(2, 3)}],
    "numpy_arrays_stacked": [{"x": np.ones((2,), dtype=np.float32)}, {"x": np.zeros((2,), dtype=np.float32)}],
    "keys_from_first_item": [{"a": [1], "n": None}, {"a": [2], "n": [5], "extra": 3}],
    "dataclass_items": [Example([1, 2], 1), Example([3, 4], 0)],
    "bare_tensors_give_empty_batch": [torch.tensor([1, 2]), torch.tensor([3, 4])],
}


@pytest.mark.parametrize("name", sorted(SAME_AS_REFERENCE))
def test_default_data_collator_matches_reference(name):
    features = SAME_AS_REFERENCE[name]
    _assert_same_batch(default_data_collator(features), transformers.default_data_collator(features))


def test_spec_example_values():
    batch = default_data_collator(SAME_AS_REFERENCE["spec_example"])
    assert set(batch) == {"labels", "a"}
    assert batch["labels"].tolist() == [1, 0] and batch["labels"].dtype == torch.long
    assert batch["a"].tolist() == [[1, 2], [3, 4]]
    assert default_data_collator(SAME_AS_REFERENCE["float_labels"])["labels"].dtype == torch.float32
    assert default_data_collator(SAME_AS_REFERENCE["bare_tensors_give_empty_batch"]) == {}


@pytest.mark.parametrize(
    "features",
    [
        [(1, 2), (3, 4)],  # tuples have no __dict__
        [{"a": [1, 2]}, {"a": [3]}],  # ragged lists
    ],
    ids=["tuples", "ragged"],
)
def test_default_data_collator_raises_like_reference(features):
    with pytest.raises(Exception) as ref_error:
        transformers.default_data_collator(features)
    with pytest.raises(type(ref_error.value)):
        default_data_collator(features)


def test_default_data_collator_refuses_other_tensor_types():
    with pytest.raises(ValueError, match="return_tensors='np'"):
        default_data_collator([{"a": 1}], return_tensors="np")


def test_remove_columns_collator_matches_reference(caplog):
    features = [
        {"input_ids": [1, 2], "label": 1, "text": "x", "idx": 0},
        {"input_ids": [3, 4], "label": 0, "text": "y", "idx": 1},
    ]
    columns = ["input_ids", "attention_mask", "label", "label_ids", "labels"]
    log = logging.getLogger("test_collate")
    ours = RemoveColumnsCollator(
        default_data_collator, columns, log, model_name="Bert", description="Training"
    )
    ref = RefRemoveColumnsCollator(
        default_data_collator, columns, log, model_name="Bert", description="Training"
    )
    with caplog.at_level(logging.INFO, logger="test_collate"):
        _assert_same_batch(ours(features), ref(features))
        ours(features)  # logged once only
    our_messages = [r.getMessage() for r in caplog.records]
    assert len(our_messages) == 2  # one from each collator
    assert our_messages[0] == our_messages[1]
    assert "in the Training set" in our_messages[0]
    # Non-dict items pass through untouched.
    items = [Example([1], 1), Example([2], 0)]
    _assert_same_batch(RemoveColumnsCollator(default_data_collator, ["input_ids"])(items), ref(items))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    vocab = tmp_path_factory.mktemp("tok") / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(45)]))
    return transformers.BertTokenizer(vocab_file=str(vocab))


@pytest.mark.parametrize("label_key", ["label", "label_ids", "labels"])
@pytest.mark.parametrize(
    "options", [{}, {"pad_to_multiple_of": 4}, {"padding": "max_length", "max_length": 6}]
)
def test_data_collator_with_padding_matches_reference(tokenizer, label_key, options):
    features = [{"input_ids": [2, 7, 8, 3], label_key: 1}, {"input_ids": [2, 9, 3], label_key: 0}]
    ours = DataCollatorWithPadding(tokenizer, **options)([dict(f) for f in features])
    ref = RefDataCollatorWithPadding(tokenizer, **options)([dict(f) for f in features])
    _assert_same_batch(dict(ours), dict(ref))
    assert "labels" in ours and "label" not in ours and "label_ids" not in ours


def test_pick_default_collator_follows_the_reference_rule(tokenizer):
    assert pick_default_collator(None) is default_data_collator
    picked = pick_default_collator(tokenizer)
    assert isinstance(picked, DataCollatorWithPadding) and picked.tokenizer is tokenizer

    class PadsButIsNotATokenizer:
        model_input_names = ["input_ids"]

        def pad(self, features, **kwargs):
            raise AssertionError("not used")

    # The reference checks the class (tokenizer / sequence feature extractor), not the `pad` method.
    assert pick_default_collator(PadsButIsNotATokenizer()) is default_data_collator
    extractor = transformers.Wav2Vec2FeatureExtractor()
    assert isinstance(pick_default_collator(extractor), DataCollatorWithPadding)
