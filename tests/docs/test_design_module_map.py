"""docs/design.md's module map is the package tree: every module has a row, and every row names a module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hf_lightning"


def _map_section() -> str:
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    start = text.index("## Module map")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _mapped_paths() -> list[str]:
    first_cells = [line.split("|")[1] for line in _map_section().splitlines() if line.startswith("| `")]
    return [path for cell in first_cells for path in re.findall(r"`(hf_lightning/[\w/]+\.py)`", cell)]


def _has_code(path: Path) -> bool:
    """A package `__init__.py` needs a row once it holds more than its docstring."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return any(not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)) for node in body)


def _modules() -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" or path.parent == PACKAGE or _has_code(path)
    }


def test_the_map_finds_rows() -> None:
    assert len(_mapped_paths()) > 50


def test_every_module_has_a_row() -> None:
    missing = sorted(_modules() - set(_mapped_paths()))
    assert not missing, f"modules without a row in docs/design.md's module map: {missing}"


def test_every_row_names_an_existing_module_once() -> None:
    paths = _mapped_paths()
    stale = sorted(path for path in paths if not (ROOT / path).is_file())
    assert not stale, f"rows of docs/design.md's module map naming no module: {stale}"
    assert len(paths) == len(set(paths)), "a module has two rows in docs/design.md's module map"
