"""notebooks/README.md lists the notebooks that are there, and says none is still to come."""

from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def test_notebooks_readme_names_each_notebook_and_promises_none():
    text = (NOTEBOOKS / "README.md").read_text(encoding="utf-8")
    for notebook in sorted(NOTEBOOKS.glob("*.ipynb")):
        assert notebook.name in text, f"notebooks/README.md does not mention {notebook.name}"
    assert "land" not in text.lower() and "until then" not in text.lower(), text
