"""parallelism_config(tp_size=2) on CPU (gloo, 2 processes): the tensor-parallel run equals the reference's
one-process run (transformers.Trainer) step for step, evaluation counts every sample once, checkpoints hold the
full weights (loadable by a one-process `from_pretrained`), and resuming from them repeats the run.

Tensor parallelism over every process is one data-parallel replica: both ranks read the same batches, so the
global batch, the loss normalisation and the updates are the one-process run's.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import safetensors.torch
import torch

from tests.distributed.launching import ROOT, launch

SCRIPT = ROOT / "tests" / "distributed" / "tp_train_script.py"
KEYS = ("loss", "grad_norm", "learning_rate", "train_loss", "eval_loss", "eval_rows", "eval_logit_mean")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("tp")
    ours = launch(SCRIPT, "ours", out_dir)
    reference = subprocess.run(
        [sys.executable, str(SCRIPT), "ref", str(out_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert reference.returncode == 0, reference.stderr[-4000:]
    output, _ = ours.communicate(timeout=600)
    assert ours.returncode == 0, output[-6000:]
    return (
        out_dir,
        json.loads((out_dir / "ref.json").read_text())["run"],
        json.loads((out_dir / "ours.json").read_text()),
    )


def _assert_same_history(
    ours: list[dict], reference: list[dict], key_order: bool = True, keys: tuple[str, ...] = KEYS
) -> None:
    assert [e["step"] for e in ours] == [e["step"] for e in reference]
    for our_entry, ref_entry in zip(ours, reference):
        assert (list(our_entry) if key_order else set(our_entry)) == (
            list(ref_entry) if key_order else set(ref_entry)
        )
        for key in keys:
            if key in ref_entry:
                assert our_entry[key] == pytest.approx(ref_entry[key], rel=1e-5, abs=1e-7), (
                    our_entry["step"],
                    key,
                )


def _assert_same_weights(ours: dict, reference: dict) -> None:
    assert set(ours) == set(reference)
    for key, values in reference.items():
        # Adam's first steps amplify the all-reduce's summation order in the smallest values.
        assert ours[key] == pytest.approx(values, rel=1e-4, abs=5e-5), key


@pytest.mark.slow
def test_tp_run_matches_the_one_process_reference(runs):
    _, reference, ours = runs
    run = ours["run"]
    assert run["strategy"] == "HFTensorParallelStrategy"
    assert run["tp_size"] == 2
    assert run["dtensor_parameters"] == 16  # 7 linear layers per block x 2, the embeddings and the LM head
    assert run["total_train_batch_size"] == 2 * 2  # one replica: micro-batch x accumulation, not x processes
    _assert_same_history(run["log_history"], reference["log_history"])
    # The 5 eval samples arrive once each (no copy per tensor-parallel rank), with the reference's predictions.
    assert run["final_eval"]["eval_rows"] == reference["final_eval"]["eval_rows"] == 5.0
    for key in ("eval_loss", "eval_logit_mean"):
        assert run["final_eval"][key] == pytest.approx(reference["final_eval"][key], rel=1e-5)
    _assert_same_weights(run["weights"], reference["weights"])


@pytest.mark.slow
def test_the_accelerator_reports_each_ranks_place_on_the_mesh(runs):
    out_dir, _, _ = runs
    facts = [json.loads((out_dir / f"accelerator-{rank}.json").read_text()) for rank in (0, 1)]
    for rank, fact in enumerate(facts):
        # accelerate's meanings: the tp rank within the replica; no dp_shard / dp_replicate dimension, so 0.
        assert fact == {
            "process_index": rank,
            "tensor_parallel_rank": rank,
            "data_parallel_shard_rank": 0,
            "data_parallel_rank": 0,
            "mesh": {"data_parallel": 1, "tensor_parallel": 2},
        }


@pytest.mark.slow
def test_tied_embeddings_stay_tied_once_split(runs):
    out_dir, _, ours = runs
    reference = json.loads((out_dir / "ref.json").read_text())["tied"]
    tied = ours["tied"]
    assert tied["tied_after_split"] is True
    assert tied["dtensor_parameters"] == 15  # the LM head's weight is the embedding's
    _assert_same_history(tied["log_history"], reference["log_history"])
    _assert_same_weights(tied["weights"], reference["weights"])


@pytest.mark.slow
def test_checkpoints_hold_the_full_weights(runs):
    out_dir, reference, ours = runs
    listing = ours["run"]["checkpoints"]["checkpoint-2"]
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json", "config.json"):
        assert name in listing
    ours_weights = safetensors.torch.load_file(
        out_dir / "ours" / "run" / "checkpoint-2" / "model.safetensors"
    )
    reference_weights = safetensors.torch.load_file(
        out_dir / "ref" / "run" / "checkpoint-2" / "model.safetensors"
    )
    assert set(ours_weights) == set(reference_weights)
    for key, value in reference_weights.items():
        assert ours_weights[key].shape == value.shape  # unsharded
        torch.testing.assert_close(ours_weights[key], value, rtol=1e-4, atol=5e-5)
    # A one-process from_pretrained of the last checkpoint is the reference's model of that step.
    from transformers import LlamaForCausalLM

    loaded = LlamaForCausalLM.from_pretrained(out_dir / "ours" / "run" / "checkpoint-4").state_dict()
    reference_last = safetensors.torch.load_file(
        out_dir / "ref" / "run" / "checkpoint-4" / "model.safetensors"
    )
    assert set(loaded) == set(reference_last)
    for key, value in reference_last.items():
        torch.testing.assert_close(loaded[key], value, rtol=1e-4, atol=5e-5)


@pytest.mark.slow
def test_the_best_checkpoint_is_loaded_back_into_the_shards(runs):
    _, reference, ours = runs
    # load_best_model_at_end: both runs pick the same checkpoint and end on its weights.
    best = {entry["step"]: entry["eval_loss"] for entry in reference["log_history"] if "eval_loss" in entry}
    assert min(best, key=best.get) == 2  # the first checkpoint: the final weights are not the last step's
    _assert_same_weights(ours["run"]["weights"], reference["weights"])


@pytest.mark.slow
def test_resuming_a_tp_run_from_its_checkpoint_repeats_it(runs):
    _, _, ours = runs
    # The resumed run started from other weights (seed 1): the checkpoint's weights and optimizer replaced them.
    # Its first entries come back from trainer_state.json, whose keys are sorted.
    resumed, run = ours["resumed"]["log_history"], ours["run"]["log_history"]
    _assert_same_history(
        resumed, run, key_order=False, keys=tuple(key for key in KEYS if key != "train_loss")
    )
    # train_loss averages the steps this train() call ran (steps 3 and 4), as the reference's does.
    losses = {entry["step"]: entry["loss"] for entry in run if "loss" in entry}
    assert resumed[-2]["train_loss"] == pytest.approx((losses[3] + losses[4]) / 2, rel=1e-6)
    _assert_same_weights(ours["resumed"]["weights"], ours["run"]["weights"])


@pytest.mark.slow
def test_a_model_without_a_tp_plan_is_refused_when_the_trainer_is_built(runs):
    _, _, ours = runs
    message = ours["gpt2_refusal"]
    assert "parallelism_config.tp_size=2" in message
    assert "GPT2LMHeadModel has no tensor-parallel plan" in message
