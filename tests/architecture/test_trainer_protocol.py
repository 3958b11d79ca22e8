"""`TrainerLike` describes the real facade: its methods exist on `HFLightningTrainer` with the same
parameters, and each of its attributes is set somewhere in the package."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from hf_lightning.core.protocols import TrainerLike
from hf_lightning.trainer.trainer import HFLightningTrainer

ROOT = Path(__file__).resolve().parents[2] / "hf_lightning"


def _protocol_members() -> tuple[list[str], list[str]]:
    methods = [
        name
        for name, value in vars(TrainerLike).items()
        if inspect.isfunction(value) and not name.startswith("__")
    ]
    attributes = list(TrainerLike.__annotations__)
    return methods, attributes


def test_every_protocol_method_is_a_facade_method_with_the_same_parameters():
    methods, _ = _protocol_members()
    assert "training_step" in methods and "_fire" in methods
    for name in methods:
        ours = getattr(HFLightningTrainer, name, None)
        assert callable(ours), f"HFLightningTrainer has no method {name}"
        expected = list(inspect.signature(getattr(TrainerLike, name)).parameters)
        assert list(inspect.signature(ours).parameters) == expected, name


def _assigned_attribute_names() -> set[str]:
    names = set()
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                        if isinstance(element, ast.Attribute):
                            names.add(element.attr)
    return names


def test_every_protocol_attribute_is_set_by_the_package():
    _, attributes = _protocol_members()
    assert "_training_run" in attributes and "state" in attributes
    assigned = _assigned_attribute_names()
    assert [name for name in attributes if name not in assigned] == []
