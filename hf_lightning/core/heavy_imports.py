"""Load Lightning (and what it pulls in: torchmetrics, torch._dynamo, transformers) without the collector's full passes.

Importing several thousand modules allocates millions of long-lived objects, and each time they grow by a quarter
Python's cyclic collector walks all of them again: about a quarter of the CPU the import takes (0.6 s of 2.5 s
here), for cycles an import hardly ever leaves behind. Only the full (oldest-generation) passes are deferred; the
young generations are still collected, so the import's short-lived cycles are freed as before and peak memory does
not grow. The thresholds are restored as they were found once the first import is done
(`benchmarks/README.md`, "CPU to the first step").
"""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

_NEVER = 2**30  # an oldest-generation threshold the import cannot reach


@contextmanager
def full_collections_deferred() -> Iterator[None]:
    """No full collection inside the block (young generations still collected); thresholds restored after it."""
    young, middle, oldest = gc.get_threshold()
    gc.set_threshold(young, middle, _NEVER)
    try:
        yield
    finally:
        gc.set_threshold(young, middle, oldest)


def import_once_deferred(name: str) -> ModuleType:
    """`importlib.import_module(name)`, its first (heavy) import run without full collections."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    with full_collections_deferred():
        return importlib.import_module(name)


def import_lightning() -> ModuleType:
    """`lightning.pytorch`, loaded without full collections the first time."""
    return import_once_deferred("lightning.pytorch")
