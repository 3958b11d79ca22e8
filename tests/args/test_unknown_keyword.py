"""A mistyped TrainingArguments keyword is Python's TypeError, with the closest field suggested."""

from __future__ import annotations

import pytest

from hf_lightning.args.training_args import Seq2SeqTrainingArguments, TrainingArguments


@pytest.mark.parametrize("cls", [TrainingArguments, Seq2SeqTrainingArguments])
def test_a_typo_suggests_the_closest_field(cls, tmp_path):
    with pytest.raises(
        TypeError, match=r"unexpected keyword argument 'learning_rte'; did you mean 'learning_rate'\?"
    ):
        cls(output_dir=str(tmp_path), learning_rte=1e-3)


def test_a_keyword_close_to_nothing_gets_the_plain_type_error(tmp_path):
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'zzzz'$"):
        TrainingArguments(output_dir=str(tmp_path), zzzz=1)
