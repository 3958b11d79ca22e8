"""The run guard on 2 processes (gloo): a bad window on one rank (NaN labels, or labels that make the loss explode)
makes every rank take the same decision, and `skip` and `rollback` give weights bit-identical to a run whose order
lacks that window; under FSDP (CPU) `rollback` and `stop` work from FSDP's checkpoint files and `skip` is refused
(tests/distributed/run_guard_script.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hf_lightning.checkpoint.files import is_complete_checkpoint
from tests.distributed.launching import side_by_side

SCRIPT = Path(__file__).resolve().parents[2] / "tests" / "distributed" / "run_guard_script.py"


@pytest.mark.slow
def test_two_processes_decide_alike_and_equal_the_run_without_the_window(tmp_path):
    launches = side_by_side(SCRIPT, tmp_path, timeout=600)
    for rank in range(2):
        reference = launches["reference"][rank]["None-nan"]
        for run in ("skip-nan", "rollback-nan", "skip-explode", "rollback-explode"):
            ours, action = launches["ours"][rank][run], run.split("-")[0]
            assert [(e["step"], e["action"], e["batches"]) for e in ours["events"]] == [
                (5, action, [8, 9])
            ], (rank, run)
            assert ours["global_step"] == reference["global_step"] == 8
            for name, value in reference["weights"].items():
                assert torch.equal(ours["weights"][name], value), (rank, run, name)


FSDP_FULL_FILES = sorted(
    ["hf_lightning_complete.json", "model.safetensors", "optimizer.bin", "pytorch_model_fsdp.bin", "rng_state_0.pth",
     "rng_state_1.pth", "scheduler.pt", "trainer_state.json", "training_args.bin"]
)  # fmt: skip
FSDP_SHARDED_FILES = ["hf_lightning_complete.json", "rng_state_0.pth", "rng_state_1.pth", "scheduler.pt",
                      "trainer_state.json"]  # fmt: skip
DISTCP_FILES = [".metadata", "__0_0.distcp", "__1_0.distcp"]


@pytest.mark.slow
def test_under_fsdp_rollback_equals_the_reference_stop_saves_once_and_skip_is_refused(tmp_path):
    # FSDP2 (full state dict files) and FSDP1 (sharded files) on CPU; the reference is transformers.Trainer on the
    # order without the window (it runs a CPU launch as DDP).
    launches = side_by_side(SCRIPT, tmp_path, timeout=600, extra=("fsdp",))
    reference = launches["reference"][0]["fsdp2-None"]
    for rank in range(2):
        ours = launches["ours"][rank]
        for fsdp, strategy in (("fsdp2", "HFFSDP2Strategy"), ("fsdp1", "HFFSDPStrategy")):
            rollback, stop, skip = (ours[f"{fsdp}-{action}"] for action in ("rollback", "stop", "skip"))
            # Both ranks: the same event, at the same step, from the one NaN window on rank 0.
            assert rollback["strategy"] == strategy
            assert [(e["step"], e["action"], e["batches"]) for e in rollback["events"]] == [(5, "rollback", [8, 9])]
            assert rollback["global_step"] == launches["reference"][rank]["fsdp2-None"]["global_step"] == 8
            assert [(e["step"], e["action"]) for e in stop["events"]] == [(5, "stop")], (rank, fsdp)
            assert stop["error"].startswith("RunGuardStop: RunGuard stopped training at step 6"), stop["error"]
            # The way out it names runs under FSDP: rollback, not skip.
            assert stop["error"].endswith("resume from it with RunGuard(action='rollback') to leave these batches out.")
            # save_steps=4: checkpoint-6 is the stop's, written once, complete, in FSDP's layout.
            expected = {"checkpoint-4": None, "checkpoint-6": None}
            if fsdp == "fsdp2":
                expected = dict.fromkeys(expected, FSDP_FULL_FILES)
            else:
                expected = {folder: FSDP_SHARDED_FILES for folder in expected} | {
                    f"checkpoint-{step}/{part}": DISTCP_FILES for step in (4, 6) for part in ("optimizer_0", "pytorch_model_fsdp_0")
                }  # fmt: skip
            assert stop["checkpoints"] == expected, (rank, fsdp)
            saved = tmp_path / f"ours-{fsdp}-stop-nan" / "checkpoint-6"
            assert is_complete_checkpoint(str(saved))
            assert json.loads((saved / "trainer_state.json").read_text())["global_step"] == 6
            assert skip["global_step"] == 0 and skip["events"] == []
            assert skip["error"].startswith("ValueError: RunGuard(action='skip')"), skip["error"]
            assert "Use RunGuard(action='rollback')" in skip["error"]
    # The weights, gathered onto rank 0: FSDP2's rollback is bit for bit the reference's run without the window.
    ours = launches["ours"][0]
    assert set(ours["fsdp2-rollback"]["weights"]) == set(reference["weights"])
    for name, value in reference["weights"].items():
        assert torch.equal(ours["fsdp2-rollback"]["weights"][name], value), name
        # FSDP1's rollback is bit for bit its own run without the window. FSDP1 itself rounds differently from DDP
        # (its flat-parameter gradient reduction and its sharded gradient norm, which clipping uses): max abs
        # difference 6e-8 after 8 steps (7e-9 with clipping off), hence the tolerance against the reference.
        assert torch.equal(ours["fsdp1-rollback"]["weights"][name], ours["fsdp1-None"]["weights"][name]), name
        torch.testing.assert_close(ours["fsdp1-None"]["weights"][name], value, rtol=0, atol=1e-7)
