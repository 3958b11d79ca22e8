"""The benchmarks time processes that read the project's bytecode, as an installed copy would."""

import importlib.util
import os
import sys

from benchmarks.bytecode import compile_tree


def test_compile_tree_writes_bytecode_that_a_fresh_import_reads(tmp_path, monkeypatch):
    package = tmp_path / "hf_lightning"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "module.py").write_text("VALUE = 3\n")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # as PYTHONDONTWRITEBYTECODE=1 sets it

    assert compile_tree(tmp_path)

    cached = importlib.util.cache_from_source(str(package / "module.py"))
    assert (package / "__pycache__").is_dir()
    assert cached.endswith(".pyc") and os.path.exists(cached)


def test_compile_tree_reports_a_file_that_does_not_compile_and_still_compiles_the_other_package(tmp_path):
    broken = tmp_path / "hf_lightning"
    broken.mkdir()
    (broken / "broken.py").write_text("def (:\n")
    other = tmp_path / "benchmarks"
    other.mkdir()
    (other / "fine.py").write_text("VALUE = 1\n")

    assert not compile_tree(tmp_path)
    assert os.path.exists(importlib.util.cache_from_source(str(other / "fine.py")))
