"""`hf-lightning <command> --help`: the TrainingArguments field descriptions, and no flood of known subclasses."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from jsonargparse import DefaultHelpFormatter

# jsonargparse lists every imported subclass of a class-typed option; for `nn.Module` that is hundreds of torch
# classes. Lists longer than this are replaced by a pointer to `--<option>.help CLASS`.
MAX_LISTED_SUBCLASSES = 12
_KNOWN_SUBCLASSES = re.compile(r", known subclasses: (?P<names>[^()]*)\)$", re.DOTALL)


class HelpFormatter(DefaultHelpFormatter):
    """jsonargparse's formatter, with a long `known subclasses` list cut to a hint."""

    def _get_help_string(self, action: Any) -> str:
        text = super()._get_help_string(action)
        match = _KNOWN_SUBCLASSES.search(text)
        if match is None or match.group("names").count(",") < MAX_LISTED_SUBCLASSES:
            return text
        option = action.option_strings[-1] if action.option_strings else action.dest
        hint = f", any subclass by class_path; {option}.help CLASS shows one's arguments)"
        return text[: match.start()] + hint


def describe_dataclass_options(parser: Any, dataclass_type: type, prefix: str) -> None:
    """Give each `--{prefix}.<field>` option of `parser` its field's `metadata["help"]` when it has no help."""
    texts = {
        field.name: field.metadata["help"] for field in dataclasses.fields(dataclass_type) if "help" in field.metadata
    }
    for action in parser._actions:
        name = action.dest[len(prefix) + 1 :] if action.dest.startswith(prefix + ".") else None
        if name in texts and not action.help:
            action.help = texts[name].replace("%", "%%")  # argparse %-formats help strings
