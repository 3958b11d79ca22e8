"""DDP on CPU (gloo, 2 processes): a run matches the reference's 2-process run step for step."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "distributed" / "ddp_train_script.py"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(side: str, out_dir: Path) -> dict:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
        "--master_addr=127.0.0.1", str(SCRIPT), side, str(out_dir),
    ]
    completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads((out_dir / f"{side}.json").read_text())


@pytest.mark.slow
def test_two_process_ddp_matches_reference(tmp_path):
    reference, ours = _launch("ref", tmp_path), _launch("ours", tmp_path)
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(ours["bert_checkpoints"]["checkpoints"]["checkpoint-2"])
    # Background checkpoint writes (AsyncCheckpointIO) under DDP: the same folders, files and training.
    background, synchronous = ours.pop("bert_checkpoints_async"), ours["bert_checkpoints"]
    assert background["checkpoints"] == synchronous["checkpoints"]
    assert background["weights"] == synchronous["weights"]
    assert [e.get("loss") for e in background["log_history"]] == [e.get("loss") for e in synchronous["log_history"]]
    for name in reference:
        ref_history, our_history = reference[name]["log_history"], ours[name]["log_history"]
        assert [e["step"] for e in our_history] == [e["step"] for e in ref_history], name
        for ref_entry, our_entry in zip(ref_history, our_history):
            assert list(our_entry) == list(ref_entry), name
            assert our_entry["epoch"] == ref_entry["epoch"]
            for key in ("loss", "grad_norm", "learning_rate", "train_loss"):
                if key in ref_entry:
                    assert our_entry[key] == pytest.approx(ref_entry[key], rel=1e-5, abs=1e-7), (name, key)
        ours_folders, reference_folders = ours[name]["checkpoints"], reference[name]["checkpoints"]
        assert list(ours_folders) == list(reference_folders), name
        for folder, files in reference_folders.items():
            # Ours holds one more file, the completion marker of the atomic save (docs/divergences.md).
            assert [f for f in ours_folders[folder] if f != "hf_lightning_complete.json"] == files, (name, folder)
        for key, values in reference[name]["weights"].items():
            assert ours[name]["weights"][key] == pytest.approx(values, rel=1e-4, abs=1e-6), (name, key)
    # Resumed from checkpoint-2 under DDP: the remaining steps and the final weights are the uninterrupted run's.
    resumed, uninterrupted = ours["bert_resume"], ours["bert_checkpoints"]
    # The history of steps 1-2 comes back from the checkpoint's trainer_state.json, as in the reference.
    assert [e["step"] for e in resumed["log_history"] if "loss" in e] == list(range(1, 9))
    tail = [e for e in uninterrupted["log_history"] if e["step"] >= 3 and "loss" in e]
    trained = [e for e in resumed["log_history"] if e["step"] >= 3 and "loss" in e]
    for resumed_entry, entry in zip(trained, tail, strict=True):
        assert resumed_entry["loss"] == pytest.approx(entry["loss"], rel=1e-5), resumed_entry["step"]
    for key, values in uninterrupted["weights"].items():
        assert resumed["weights"][key] == pytest.approx(values, rel=1e-4, abs=1e-6), key
