"""Lightning's first import runs without the collector's full passes, and the collector is left as it was found."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import sysconfig
import threading

import pytest

from hf_lightning.core.heavy_imports import full_collections_deferred

# CPython 3.10-3.13 with the GIL: a full pass whenever the oldest generation's threshold is crossed. 3.14's
# incremental collector (and a free-threaded build's) has no such threshold, and the deferral changes nothing there.
GENERATIONAL_COLLECTOR = sys.version_info < (3, 14) and not sysconfig.get_config_var("Py_GIL_DISABLED")
# Every test reads the oldest threshold back, which such an interpreter does not keep.
pytestmark = pytest.mark.skipif(
    not GENERATIONAL_COLLECTOR, reason="no oldest-generation threshold on this interpreter"
)

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
    # The same import left to those thresholds walks the whole heap several times over.
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


@pytest.mark.slow
def test_two_threads_loading_lightning_at_once_both_get_the_whole_module_and_the_thresholds_come_back():
    probe = """
import gc, json, threading
import torch
from hf_lightning.core.heavy_imports import import_lightning
gc.set_threshold(700, 10, 10)
start = threading.Barrier(2)
complete = []
def load():
    start.wait()
    complete.append(hasattr(import_lightning(), "Trainer"))
threads = [threading.Thread(target=load) for _ in range(2)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps({"complete": complete, "after": gc.get_threshold()}))
"""
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300
    )
    seen = json.loads(completed.stdout.strip().splitlines()[-1])
    assert seen == {"complete": [True, True], "after": [700, 10, 10]}


def _in_thread(entered: threading.Event, leave: threading.Event) -> threading.Thread:
    def hold() -> None:
        with full_collections_deferred():
            entered.set()
            leave.wait(timeout=30)

    thread = threading.Thread(target=hold)
    thread.start()
    return thread


@pytest.mark.parametrize("first_to_leave", ["the first in", "the second in"])
def test_overlapping_blocks_restore_the_threshold_found_before_the_first(first_to_leave):
    found = gc.get_threshold()
    try:
        gc.set_threshold(600, 9, 11)
        events = [(threading.Event(), threading.Event()) for _ in range(2)]
        threads = []
        for entered, leave in events:
            threads.append(_in_thread(entered, leave))
            assert entered.wait(timeout=30)
        assert gc.get_threshold()[2] > 10**6  # both inside: deferred
        order = [0, 1] if first_to_leave == "the first in" else [1, 0]
        events[order[0]][1].set()
        threads[order[0]].join(timeout=30)
        assert gc.get_threshold()[2] > 10**6  # one still inside: still deferred
        events[order[1]][1].set()
        threads[order[1]].join(timeout=30)
        assert gc.get_threshold() == (600, 9, 11)
    finally:
        gc.set_threshold(*found)


def test_a_threshold_set_inside_the_block_is_kept():
    found = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        with full_collections_deferred():
            gc.set_threshold(1000, 20, 30)  # the user's own choice, made while the deferral holds
        assert gc.get_threshold() == (1000, 20, 30)
    finally:
        gc.set_threshold(*found)
