"""FutureWarnings for v4 names point at the user's line, not at hf_lightning's source, however they are reached."""

from __future__ import annotations

import warnings

import pytest

from hf_lightning import HfArgumentParser, Seq2SeqTrainingArguments, TrainingArguments

V4 = {"output_dir": "out", "report_to": "none", "evaluation_strategy": "no"}


def _future_warnings(build) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build()
    found = [warning for warning in caught if issubclass(warning.category, FutureWarning)]
    assert found, "no FutureWarning was raised"
    return found


@pytest.mark.parametrize(
    "build",
    [
        lambda: TrainingArguments(**V4),
        lambda: Seq2SeqTrainingArguments(**V4),
        lambda: Seq2SeqTrainingArguments(output_dir="out", report_to="none", gradient_checkpointing=True),
        lambda: HfArgumentParser(TrainingArguments).parse_dict(V4),
        lambda: HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
            ["--output_dir", "out", "--report_to", "none", "--evaluation_strategy", "no"]
        ),
    ],
    ids=["training_args", "seq2seq_args", "seq2seq_gradient_checkpointing", "parse_dict", "parse_args"],
)
def test_v4_name_warnings_point_at_the_caller(build):
    for warning in _future_warnings(build):
        assert warning.filename == __file__, (warning.filename, warning.lineno, str(warning.message))
