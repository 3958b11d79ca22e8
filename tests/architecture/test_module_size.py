"""No module of the package is over 600 lines, but the field catalogue (one entry per reference field): a module
that long is asking to be split along a seam (docs/design.md, "Conventions")."""

from __future__ import annotations

from tests.architecture.test_import_cycles import ROOT

LIMIT = 600
CATALOGUE = {"hf_lightning/args/declarations.py"}


def test_no_module_is_over_the_limit():
    long = {
        str(path.relative_to(ROOT.parent)): count
        for path in sorted(ROOT.rglob("*.py"))
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > LIMIT
    }
    assert set(long) - CATALOGUE == set(), f"modules over {LIMIT} lines (split them along a seam): {long}"


def test_the_catalogue_is_the_one_exception_and_exists():
    assert all((ROOT.parent / path).is_file() for path in CATALOGUE)
