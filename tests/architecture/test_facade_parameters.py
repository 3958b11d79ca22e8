"""No function outside the facade's room takes the facade: below the room, a parameter that receives the trainer is
typed with the narrow port its component declares (the members it uses), never `Any`, left bare, or the facade's own
class. Above the room (the CLI that builds the trainer, the library adapters that subclass it) the facade's class is
what they hold; `Any` or nothing is refused there too.

Lightning's trainer (`pl.Trainer`, `lightning.pytorch.Trainer`), which Lightning hands to callbacks and strategies,
is not the facade and is allowed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.architecture.test_import_cycles import ROOT
from tests.architecture.test_layers import LAYERS

FACADE_ROOM = ROOT / "trainer"
# Parameter names that carry a trainer: `trainer`, `facade`, `owner` and names ending in `_trainer` / `_facade`.
TRAINER_NAME = re.compile(r"(^|_)(trainer|facade|owner)$")
# Annotations that say nothing narrower than "the facade"; above the room only the first two.
UNTYPED = {"Any", "object"}
FACADE_CLASSES = {"HFLightningTrainer", "HFLightningSeq2SeqTrainer", "Trainer", "Seq2SeqTrainer"}
ABOVE_THE_ROOM = {name for level in LAYERS[[("trainer",) == names for names in LAYERS].index(True) + 1 :] for name in level}
LIGHTNING_TRAINER = {"pl.Trainer", "lightning.pytorch.Trainer", "L.Trainer", "lightning.Trainer"}


def _wide(annotation: ast.expr | None, wide: set[str]) -> str | None:
    """Why `annotation` is too wide for a trainer parameter (it names one of `wide`), or None."""
    if annotation is None:
        return "no annotation"
    text = ast.unparse(annotation).strip("'\"")
    if text in LIGHTNING_TRAINER:
        return None
    names = {part.strip() for part in re.split(r"[|\[\],]", text) if part.strip() and part.strip() != "None"}
    return f"annotated {text}" if any(name.split(".")[-1] in wide for name in names) else None


def wide_trainer_parameters(root: Path = ROOT) -> list[str]:
    """`file:line function(parameter): why` for each trainer parameter outside the facade's room typed too wide."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if FACADE_ROOM in path.parents:
            continue
        subpackage = path.relative_to(root).parts[0] if len(path.relative_to(root).parts) > 1 else ""
        wide = UNTYPED if subpackage in ABOVE_THE_ROOM or not subpackage else UNTYPED | FACADE_CLASSES
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            arguments = node.args
            for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                if argument.arg in {"self", "cls"} or not TRAINER_NAME.search(argument.arg):
                    continue
                why = _wide(argument.annotation, wide)
                if why:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name}({argument.arg}): {why}")
    return found


def test_no_function_outside_the_facade_room_takes_the_facade():
    assert FACADE_ROOM.is_dir(), "the facade's room moved: point FACADE_ROOM at it"
    wide = wide_trainer_parameters()
    assert wide == [], "trainer parameters typed as the whole facade (give them the component's port):\n" + "\n".join(
        wide
    )


def test_the_scan_sees_a_wide_parameter(tmp_path: Path):
    package = tmp_path / "hf_lightning"
    (package / "component").mkdir(parents=True)
    (package / "component" / "mod.py").write_text(
        "from typing import Any\n"
        "def save(trainer: Any, path: str) -> None: ...\n"
        "def load(owner, path: str) -> None: ...\n"
        "def hook(trainer: 'pl.Trainer') -> None: ...\n"
        "def narrow(trainer: SaveHooks) -> None: ...\n"
        "def whole(facade: 'HFLightningTrainer') -> None: ...\n"
    )
    (package / "cli").mkdir()
    (package / "cli" / "build.py").write_text("def run(trainer: HFLightningTrainer, owner: Any) -> None: ...\n")
    assert [row.split(" ", 1)[1] for row in wide_trainer_parameters(package)] == [
        "run(owner): annotated Any",
        "save(trainer): annotated Any",
        "load(owner): no annotation",
        "whole(facade): annotated HFLightningTrainer",
    ]
