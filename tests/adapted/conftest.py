"""The tiny sentence-transformers model folder, built once per test session."""

from __future__ import annotations

import pytest

from tests.adapted.st_harness import tiny_model_dir


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> str:
    return tiny_model_dir(tmp_path_factory.mktemp("models"))
