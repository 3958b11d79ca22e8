"""Lightning's first import runs without the collector's full passes, and the collector is left as it was found."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest

from hf_lightning.core.heavy_imports import full_collections_deferred

# Counts the collections of each generation while `STATEMENT` runs in a fresh interpreter (torch loaded first, as
# in every training script), and reports the thresholds before and after it.
_PROBE = """
import gc, json, sys
import torch
from hf_lightning.core.seeding import seed_from_args
collections = {0: 0, 1: 0, 2: 0}
def count(phase, info):
    if phase == "start":
        collections[info["generation"]] += 1
gc.set_threshold(500, 7, 9)
before = gc.get_threshold()
gc.callbacks.append(count)
STATEMENT
gc.callbacks.remove(count)
print(json.dumps({"collections": collections, "before": before, "after": gc.get_threshold(),
                  "lightning_loaded": "lightning.pytorch" in sys.modules}))
"""


def _collections_during(statement: str) -> dict:
    completed = subprocess.run(
        [sys.executable, "-c", _PROBE.replace("STATEMENT", statement)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_first_import_at_the_seeding_makes_no_full_collection_and_restores_the_thresholds():
    plain = _collections_during("import lightning.pytorch")
    ours = _collections_during(
        "from types import SimpleNamespace; seed_from_args(SimpleNamespace(seed=0, full_determinism=False))"
    )

    assert plain["lightning_loaded"] and ours["lightning_loaded"]
    # The same import left to the collector's defaults walks the whole heap several times over.
    assert plain["collections"]["2"] >= 2
    # Ours makes none of those full passes, but still frees the young generations as before.
    assert ours["collections"]["2"] == 0
    assert ours["collections"]["0"] >= plain["collections"]["0"] // 2 > 0
    assert ours["after"] == ours["before"] == [500, 7, 9]


def test_the_thresholds_are_restored_as_found_even_when_the_block_raises():
    found = gc.get_threshold()
    enabled = gc.isenabled()
    try:
        gc.set_threshold(321, 4, 5)
        with pytest.raises(RuntimeError), full_collections_deferred():
            young, middle, oldest = gc.get_threshold()
            assert (young, middle) == (321, 4) and oldest > 10**6
            raise RuntimeError("an import failed")
        assert gc.get_threshold() == (321, 4, 5)
        assert gc.isenabled() == enabled  # the collector's on/off state is never touched
    finally:
        gc.set_threshold(*found)
