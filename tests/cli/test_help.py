"""`hf-lightning fit --help` describes every TrainingArguments option and lists no flood of torch classes."""

from __future__ import annotations

import dataclasses
import re

import pytest

from hf_lightning.args.training_args import Seq2SeqTrainingArguments
from hf_lightning.cli.lightning_cli import main


@pytest.fixture(scope="module")
def fit_help() -> str:
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["fit", "--help"]) == 0
    return buffer.getvalue()


def _option_block(text: str, option: str) -> str:
    """The help paragraph of `option`: from its line to the next option line."""
    match = re.search(rf"^  {re.escape(option)}[ \n].*?(?=^  -|\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"{option} is not in the help"
    return " ".join(match.group(0).split())


def test_fit_help_describes_each_args_option(fit_help):
    described = [field for field in dataclasses.fields(Seq2SeqTrainingArguments) if "help" in field.metadata]
    assert len(described) > 100
    for field in described:
        block = _option_block(fit_help, f"--args.{field.name}")
        first_words = " ".join(field.metadata["help"].split()[:4])
        assert first_words in block, (field.name, block)


def test_fit_help_drops_the_module_subclass_flood(fit_help):
    assert "torch.nn.Linear" not in fit_help and "torch.ao.nn" not in fit_help
    assert "--model.help CLASS" in _option_block(fit_help, "--model")
    # A short list still helps: the built-in data sources stay named.
    assert "EmbeddedClassificationData" in _option_block(fit_help, "--data")
    assert len(fit_help.splitlines()) < 650, len(fit_help.splitlines())
