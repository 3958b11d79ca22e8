"""The run guard on 2 processes (gloo): a bad window on one rank (NaN labels, or labels that make the loss explode)
makes every rank take the same decision, and `skip` and `rollback` give weights bit-identical to a run whose order lacks that window (tests/distributed/
run_guard_script.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.distributed.launching import side_by_side

SCRIPT = Path(__file__).resolve().parents[2] / "tests" / "distributed" / "run_guard_script.py"


@pytest.mark.slow
def test_two_processes_decide_alike_and_equal_the_run_without_the_window(tmp_path):
    launches = side_by_side(SCRIPT, tmp_path, timeout=600)
    for rank in range(2):
        reference = launches["reference"][rank]["None-nan"]
        for run in ("skip-nan", "rollback-nan", "skip-explode", "rollback-explode"):
            ours, action = launches["ours"][rank][run], run.split("-")[0]
            assert [(e["step"], e["action"], e["batches"]) for e in ours["events"]] == [(5, action, [8, 9])], (rank, run)
            assert ours["global_step"] == reference["global_step"] == 8
            for name, value in reference["weights"].items():
                assert torch.equal(ours["weights"][name], value), (rank, run, name)
