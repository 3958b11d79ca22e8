"""`on_save` runs on every process only after the checkpoint it announces is complete on disk, in both write modes.

Two processes (gloo) train with saves at steps 2, 4 and 6 while the saving rank is slowed before its commit; a
callback reads `checkpoint-<state.global_step>` in `on_save` on each rank (tests/distributed/on_save_script.py).
With background writes the announcement waits for the commit, comes at one step boundary on every rank, and carries
the trainer state of the save's step.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from tests.distributed.launching import WORLD_SIZE, launch

pytestmark = pytest.mark.slow  # one 2-process launch

SCRIPT = Path(__file__).resolve().parents[1] / "distributed" / "on_save_script.py"


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> list[dict]:
    out_dir = tmp_path_factory.mktemp("on_save")
    process = launch(SCRIPT, "ours", out_dir)
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output[-6000:]
    return [pickle.loads((out_dir / f"ours_rank{rank}.pkl").read_bytes()) for rank in range(WORLD_SIZE)]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_every_rank_finds_the_announced_checkpoint_complete(seen, mode):
    for rank, report in enumerate(seen):
        calls = report[mode]
        assert [call["step"] for call in calls] == [2, 4, 6], rank
        for call in calls:
            assert call["problem"] is None, (rank, call)
            assert call["saved_step"] == call["step"], (rank, call)
            assert call["last"] == f"checkpoint-{call['step']}", (rank, call)


def test_synchronous_saves_are_announced_at_their_own_step(seen):
    for report in seen:
        assert [call["after_steps"] for call in report["sync"]] == [2, 4, 6]


def test_background_saves_are_announced_at_one_step_boundary_on_every_rank(seen):
    boundaries = [[call["after_steps"] for call in report["async"]] for report in seen]
    assert boundaries[0] == boundaries[1]
    for call in seen[0]["async"]:
        assert call["after_steps"] >= call["step"]
