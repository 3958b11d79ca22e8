"""Load Lightning (and what it pulls in: torchmetrics, torch._dynamo, transformers) without the collector's full passes.

Importing thousands of modules allocates hundreds of thousands of long-lived objects, and each time they grow by a
quarter Python's cyclic collector walks all of them again: four full passes, 0.5 s of the 2.5 s of CPU that
Lightning's import takes when it brings transformers in with it (through torchmetrics), for cycles an import hardly
ever leaves behind. Only the full (oldest-generation) passes are deferred; the young generations are still collected,
so the import's short-lived cycles are freed as before and peak memory does not grow. The oldest threshold is
restored as it was found, and the collector then makes its one full pass over the grown heap as it would have. A
script that imported transformers first saves little: Lightning's own import then crosses one full pass at most
(`benchmarks/README.md`, "Won back at the first step"). This is the generational collector of CPython 3.10-3.13;
3.14's incremental collector ignores the third threshold, and there this changes nothing.
"""

from __future__ import annotations

import gc
import importlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

_NEVER = 2**30  # an oldest-generation threshold the import cannot reach


class _Deferral:
    """Who is inside `full_collections_deferred` (threads may overlap), and the oldest threshold to give back."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.found_oldest = 0


_DEFERRAL = _Deferral()


@contextmanager
def full_collections_deferred() -> Iterator[None]:
    """No full collection inside the block (young generations still collected). Overlapping blocks (threads, nesting)
    share one deferral: the threshold found by the first is restored when the last leaves, unless someone set
    their own meanwhile; the young and middle thresholds are never touched."""
    with _DEFERRAL.lock:
        if _DEFERRAL.depth == 0:
            young, middle, _DEFERRAL.found_oldest = gc.get_threshold()
            gc.set_threshold(young, middle, _NEVER)
        _DEFERRAL.depth += 1
    try:
        yield
    finally:
        with _DEFERRAL.lock:
            _DEFERRAL.depth -= 1
            young, middle, oldest = gc.get_threshold()
            if _DEFERRAL.depth == 0 and oldest == _NEVER:
                gc.set_threshold(young, middle, _DEFERRAL.found_oldest)


def import_lightning() -> ModuleType:
    """`lightning.pytorch`, loaded without full collections the first time (later calls: the loaded module, after
    waiting, as any import does, for a thread still loading it)."""
    with full_collections_deferred():
        return importlib.import_module("lightning.pytorch")
