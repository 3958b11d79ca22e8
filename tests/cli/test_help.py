"""`hf-lightning fit --help` is one screen, printed before torch or Lightning load; `--args.help` describes every
TrainingArguments option; `--model.help CLASS` still lists a class's arguments (jsonargparse)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hf_lightning.args.training_args import Seq2SeqTrainingArguments
from hf_lightning.cli.lightning_cli import SUBCOMMANDS, main
from hf_lightning.cli.quick_help import BUILT_IN_DATA

ROOT = Path(__file__).resolve().parents[2]


def _printed(argv: list[str]) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(argv) == 0
    return buffer.getvalue()


@pytest.fixture(scope="module")
def fit_help() -> str:
    return _printed(["fit", "--help"])


def _option_block(text: str, option: str) -> str:
    """The help paragraph of `option`: from its line to the next option line."""
    match = re.search(rf"^  {re.escape(option)}[ \n].*?(?=^  -|\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"{option} is not in the help"
    return " ".join(match.group(0).split())


def test_fit_help_loads_neither_torch_nor_lightning():
    """It took 9-13 s (the imports jsonargparse's help needs) and printed 578 lines."""
    script = (
        "import sys\nfrom hf_lightning.cli.lightning_cli import main\nmain(['fit', '--help'])\n"
        "print(sorted(name for name in ('torch', 'lightning', 'jsonargparse') if name in sys.modules))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert completed.stdout.splitlines()[-1] == "[]", completed.stdout[-2000:]
    assert len(completed.stdout.splitlines()) < 40


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_each_command_help_names_every_section_and_where_its_details_are(command):
    text = _printed([command, "-h"])
    assert text.startswith(f"usage: hf-lightning {command} ") and SUBCOMMANDS[command] in text
    for option in ("-c, --config", "--print_config", "--args.FIELD", "--model", "--data", "--trainer.KEY",
                   "--trainer_class", "--ckpt_path"):  # fmt: skip
        _option_block(text, option)
    flat = " ".join(text.split())
    assert f"hf-lightning {command} --args.help" in flat and f"hf-lightning {command} --model.help CLASS" in flat


def test_the_help_names_only_what_exists(fit_help):
    import hf_lightning.cli.data_sources as data_sources
    from hf_lightning.engine.lightning_bridge import SAFE_LIGHTNING_OVERRIDES

    defined = sorted(
        name
        for name, value in vars(data_sources).items()
        if isinstance(value, type)
        and data_sources.DataSource in value.__mro__[1:]  # a subclass (the ABC also recognises look-alikes)
        and value.__module__ == data_sources.__name__
    )
    assert sorted(BUILT_IN_DATA) == defined
    named = re.search(r"take precedence \(([^)]*)\)", _option_block(fit_help, "--trainer.KEY")).group(1)
    assert {key.strip() for key in named.split(",")} - {"..."} <= set(SAFE_LIGHTNING_OVERRIDES)


def test_args_help_describes_each_args_option():
    text = _printed(["fit", "--args.help"])
    described = [field for field in dataclasses.fields(Seq2SeqTrainingArguments) if "help" in field.metadata]
    assert len(described) > 100
    for field in described:
        block = _option_block(text, f"--args.{field.name}")
        first_words = " ".join(field.metadata["help"].split()[:4])
        assert first_words in block, (field.name, block)


def test_model_help_lists_a_class_arguments(capsys):
    assert main(["fit", "--model.help", "hf_lightning.cli.embedded.TinyTransformerClassifier"]) == 0
    out = capsys.readouterr().out
    assert "vocab_size" in out and "torch.nn.Linear" not in out
