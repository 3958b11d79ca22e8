"""Shared fixtures. Parity tests need the reference (transformers): its absence fails the run."""

from __future__ import annotations

import importlib.util
import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_REQUIRED_TEST_PACKAGES = ("transformers", "accelerate", "datasets", "tokenizers")


def pytest_sessionstart(session: pytest.Session) -> None:
    missing = [name for name in _REQUIRED_TEST_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise pytest.UsageError(
            f"Test dependencies missing: {', '.join(missing)}. Install them with `pip install -e .[dev]`; "
            "parity tests never skip."
        )
