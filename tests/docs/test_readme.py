"""The README's argument table is the registry's, and its set-up commands are what CI runs."""

from __future__ import annotations

from pathlib import Path

from hf_lightning.translation.handler_table import registry_markdown

ROOT = Path(__file__).resolve().parents[2]


def test_readme_table_is_generated_from_the_registry():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("<!-- registry:start -->\n") + len("<!-- registry:start -->\n")
    end = readme.index("<!-- registry:end -->")
    assert readme[start:end] == registry_markdown(), "regenerate with: python -m hf_lightning.field_registry"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = "python -m pytest -q -p no:cacheprovider"
    assert test_command in readme
    assert test_command in ci
    assert "-c .ci/constraints.txt" in readme and "-c .ci/constraints.txt" in ci
