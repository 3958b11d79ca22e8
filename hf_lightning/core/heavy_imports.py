"""Load Lightning (and what it pulls in: torchmetrics, torch._dynamo, transformers) without the collector's full passes.

Importing thousands of modules allocates hundreds of thousands of long-lived objects, and each time they grow by a
quarter Python's cyclic collector walks all of them again: four full passes, 0.5 s of the 2.5 s of CPU that
Lightning's import takes when it brings transformers in with it (through torchmetrics), for cycles an import hardly
ever leaves behind. Only the full (oldest-generation) passes are deferred; the young generations are still collected,
so the import's short-lived cycles are freed as before and peak memory does not grow. The thresholds are restored as
they were found, and the collector then makes its one full pass over the grown heap as it would have. A script
that imported transformers first saves little: Lightning's own import then crosses one full pass at most
(`benchmarks/README.md`, "Won back at the first step").
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
