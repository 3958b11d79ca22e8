"""FSDP on CPU (gloo, 2 processes) through Lightning: FSDP1 and FSDP2 runs match the reference's 2-process run step
for step, write the reference's FSDP checkpoint files, and resume from them.

The reference itself trains such a CPU launch with DDP (accelerate sets FSDP up only on accelerators), which
computes the same updates; its checkpoints are therefore DDP's, and the FSDP layout is checked against
accelerate's naming (`save_fsdp_model` / `save_fsdp_optimizer`).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "distributed" / "fsdp_train_script.py"
MARKER = "hf_lightning_complete.json"
COMMON_FILES = ["rng_state_0.pth", "rng_state_1.pth", "scheduler.pt", "trainer_state.json"]
# accelerate's names: FULL_STATE_DICT gathers on rank 0, SHARDED_STATE_DICT writes torch distributed checkpoints.
FULL_FILES = sorted(
    COMMON_FILES
    + [
        "config.json",
        "model.safetensors",
        "training_args.bin",
        "pytorch_model_fsdp.bin",
        "optimizer.bin",
        MARKER,
    ]
)
SHARDED_FOLDER_FILES = [".metadata", "__0_0.distcp", "__1_0.distcp"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(side: str, out_dir: Path) -> dict:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={_free_port()}",
        "--master_addr=127.0.0.1",
        str(SCRIPT),
        side,
        str(out_dir),
    ]
    completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads((out_dir / f"{side}.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("fsdp")
    return out_dir, _launch("ref", out_dir), _launch("ours", out_dir)


def _assert_same_run(
    ours: dict,
    reference: dict,
    name: str,
    key_order: bool = True,
    keys=("loss", "grad_norm", "learning_rate", "train_loss"),
) -> None:
    ours_history, ref_history = ours["log_history"], reference["log_history"]
    assert [e["step"] for e in ours_history] == [e["step"] for e in ref_history], name
    for our_entry, ref_entry in zip(ours_history, ref_history):
        assert (list(our_entry) if key_order else set(our_entry)) == (
            list(ref_entry) if key_order else set(ref_entry)
        ), name
        assert our_entry["epoch"] == ref_entry["epoch"], name
        for key in keys:
            if key in ref_entry:
                assert our_entry[key] == pytest.approx(ref_entry[key], rel=1e-5, abs=1e-7), (name, key)
    assert set(ours["weights"]) == set(reference["weights"]), name
    for key, values in reference["weights"].items():
        assert ours["weights"][key] == pytest.approx(values, rel=1e-5, abs=1e-6), (name, key)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "reference_name", "strategy"),
    [
        ("bert_v2_full", "bert_v2_full", "HFFSDP2Strategy"),
        ("bert_v1_sharded", "bert_v2_full", "HFFSDPStrategy"),
        ("gpt2_v2_sharded", "gpt2_v2_sharded", "HFFSDP2Strategy"),
        # parallelism_config(dp_shard_size=2): FSDP2 on the mesh, equal to the reference's FSDP2 run.
        ("bert_dp_shard", "bert_v2_full", "HFFSDP2Strategy"),
    ],
)
def test_fsdp_run_matches_the_reference(runs, name, reference_name, strategy):
    _, reference, ours = runs
    assert ours[name]["strategy"] == strategy
    # Evaluation's autocast rule reads this (hf_lightning/evaluation/loop.py): FSDP2 sharded the model, FSDP1 wrapped it.
    assert ours[name]["model_is_fsdp2"] is (strategy == "HFFSDP2Strategy")
    _assert_same_run(ours[name], reference[reference_name], name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert_v1_sharded", "gpt2_v2_sharded"])
def test_resuming_from_an_fsdp_checkpoint_repeats_the_run(runs, name):
    _, _, ours = runs
    # The resumed run started from other weights (seed 1): the checkpoint's weights and optimizer replaced them.
    # Its first entries come back from trainer_state.json, whose keys are sorted.
    resumed = ours[f"{name}_resumed"]
    _assert_same_run(
        resumed, ours[name], f"{name}_resumed", key_order=False, keys=("loss", "grad_norm", "learning_rate")
    )
    # train_loss averages the steps this train() call ran (steps 3 and 4), as the reference's does.
    losses = {entry["step"]: entry["loss"] for entry in ours[name]["log_history"] if "loss" in entry}
    assert resumed["log_history"][-1]["train_loss"] == pytest.approx((losses[3] + losses[4]) / 2, rel=1e-6)


@pytest.mark.slow
def test_checkpoint_files_are_named_as_accelerate_names_them(runs):
    out_dir, reference, ours = runs
    for step in ("checkpoint-2", "checkpoint-4"):
        assert ours["bert_v2_full"]["checkpoints"][step] == FULL_FILES
        assert ours["bert_dp_shard"]["checkpoints"][step] == FULL_FILES  # fsdp_config's defaults: full state dict
        for name in ("bert_v1_sharded", "gpt2_v2_sharded"):
            folders = ours[name]["checkpoints"]
            # A sharded save writes no model.safetensors nor training_args.bin, as the reference's save_model; the
            # model's config (and a generative model's generation config) sits beside the shards, so the folder
            # consolidates on its own (docs/divergences.md).
            configs = ["config.json"] + (["generation_config.json"] if name.startswith("gpt2") else [])
            assert folders[step] == sorted(COMMON_FILES + [MARKER] + configs), name
            assert folders[f"{step}/pytorch_model_fsdp_0"] == SHARDED_FOLDER_FILES, name
            assert folders[f"{step}/optimizer_0"] == SHARDED_FOLDER_FILES, name
    # The full weights are the reference's (its DDP checkpoint of the same step), in both files.
    ours_dir = out_dir / "ours" / "bert_v2_full" / "checkpoint-2"
    reference_weights = safetensors.torch.load_file(
        out_dir / "ref" / "bert_v2_full" / "checkpoint-2" / "model.safetensors"
    )
    ours_weights = safetensors.torch.load_file(ours_dir / "model.safetensors")
    fsdp_weights = torch.load(ours_dir / "pytorch_model_fsdp.bin", weights_only=True)
    assert set(ours_weights) == set(reference_weights)
    for key, value in reference_weights.items():
        torch.testing.assert_close(ours_weights[key], value, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(fsdp_weights[key], value, rtol=1e-5, atol=1e-6)
    optimizer_state = torch.load(ours_dir / "optimizer.bin", weights_only=True)
    assert set(optimizer_state["state"]) <= set(fsdp_weights)  # keyed by parameter names, as FSDP saves it
