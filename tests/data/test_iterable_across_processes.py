"""An IterableDataset trained on 2 processes (gloo) gives each rank the batches transformers.Trainer gives it (R3.7):
dealt from rank 0 by default, read by every rank with `dispatch_batches=False`, split by shard for an HF datasets
stream; `split_batches` both ways; a sized iterable's epochs; a dataset generator synchronised across ranks; a resume
mid-epoch. Both launches run at once (tests/distributed/iterable_script.py).
The helpers of `hf_lightning/data/iterable_sharding.py` are checked in one process below."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hf_lightning.data.iterable_sharding import IterableDatasetShard, batch_size_of, concatenate, slice_batch
from tests.distributed.iterable_script import EVALUATIONS, NUM_EXAMPLES, SCENARIOS
from tests.distributed.launching import side_by_side

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "distributed" / "iterable_script.py"
ALL = (*SCENARIOS, "dispatched_resumed")


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    return side_by_side(SCRIPT, tmp_path_factory.mktemp("iterable_across_processes"), timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ALL)
def test_each_rank_sees_the_references_examples_in_its_order(launches, scenario):
    for rank in range(2):
        ours, reference = launches["ours"][rank][scenario], launches["reference"][rank][scenario]
        assert ours["seen"] == reference["seen"], rank
        assert ours["epochs_told"] == reference["epochs_told"], rank


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ALL)
def test_losses_and_weights_match_the_reference(launches, scenario):
    for rank in range(2):
        ours, reference = launches["ours"][rank][scenario], launches["reference"][rank][scenario]
        assert [e.get("step") for e in ours["log_history"]] == [e.get("step") for e in reference["log_history"]]
        for mine, theirs in zip(ours["log_history"], reference["log_history"]):
            assert mine.keys() == theirs.keys()
            for key in mine:
                assert mine[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-7), (rank, key)
        for key, values in ours["weights"].items():
            assert values == pytest.approx(reference["weights"][key], rel=1e-5, abs=1e-7), (rank, key)


@pytest.mark.slow
def test_what_the_comparison_covers(launches):
    """The ranks train on different examples, every example of an epoch is seen, the tail is completed from the
    epoch's start, and a split batch gives each rank half of the loader's batch."""
    rank0, rank1 = (launches["ours"][rank]["dispatched"]["seen"] for rank in range(2))
    assert all(len(batch) == 2 for batch in rank0[:5] + rank1[:5])
    first_epoch = [i for step in range(6) for i in rank0[step] + rank1[step]]
    assert set(first_epoch) == set(range(NUM_EXAMPLES))  # the whole epoch, across the ranks
    assert len(rank0[5]) == len(rank1[5]) == 1  # the tail: 1 example, completed by the epoch's first
    assert rank1[5] == rank0[0][:1]
    split0 = launches["ours"][0]["dispatched_split"]["seen"]
    assert all(len(batch) == 2 for batch in split0[:5])
    assert launches["ours"][0]["dispatched"]["epochs_told"] == [0, 1, 2]
    sized = launches["ours"][0]["sized_dispatched"]
    assert sized["max_steps"] == 6 == launches["reference"][0]["sized_dispatched"]["max_steps"]  # 2 epochs of 3 windows
    seeded0, seeded1 = (launches["ours"][rank]["generator_each_reads"]["seen"] for rank in range(2))
    assert not set(seeded0[0]) & set(seeded1[0])  # one order on both ranks: each keeps its own part of it
    stream0, stream1 = (launches["ours"][rank]["stream_by_shard"]["seen"] for rank in range(2))
    assert {i % 2 for batch in stream0 for i in batch} == {0} and {i % 2 for batch in stream1 for i in batch} == {1}


@pytest.mark.slow
@pytest.mark.parametrize("scenario", EVALUATIONS)
def test_evaluate_predict_and_evaluations_in_training_match_the_reference(launches, scenario):
    for rank in range(2):
        ours, reference = launches["ours"][rank][scenario], launches["reference"][rank][scenario]
        assert ours.keys() == reference.keys()
        for key in ours:
            mine, theirs = ours[key], reference[key]
            if key in ("train_log", "train_evaluations"):  # lists of logged dicts
                assert len(mine) == len(theirs), rank
                for entry, expected in zip(mine, theirs):
                    assert entry == pytest.approx(expected, rel=1e-5, abs=1e-7), (rank, key)
            else:
                assert mine == pytest.approx(theirs, rel=1e-5, abs=1e-7), (rank, key)


@pytest.mark.slow
def test_the_evaluation_comparison_sees_every_example_once_when_dealt(launches):
    """Dealt from rank 0, the gather drops the example that completed the last batch: 21 predictions. Each rank
    reading its shard keeps the repeated ones, as the reference does (24)."""
    assert launches["ours"][0]["evaluated_dispatched"]["evaluate"]["eval_count"] == NUM_EXAMPLES
    assert len(launches["ours"][1]["evaluated_dispatched"]["predictions"]) == NUM_EXAMPLES
    assert launches["ours"][0]["evaluated_each_reads"]["evaluate"]["eval_count"] == 24
    assert len(launches["ours"][0]["evaluated_dispatched"]["train_evaluations"]) == 3  # steps 7 and 14, evaluate()


@pytest.mark.slow
def test_evaluate_before_train_still_synchronises_the_ranks(launches):
    """docs/divergences.md: after evaluate(), the reference's train() leaves the model unwrapped, so the ranks'
    gradients are never averaged and their weights drift apart; ours trains under DDP, the ranks stay equal."""
    ours = [launches["ours"][rank]["evaluate_then_train"] for rank in range(2)]
    reference = [launches["reference"][rank]["evaluate_then_train"] for rank in range(2)]
    assert ours[0]["wrapped"] == "DistributedDataParallel" and ours[0]["weights"] == ours[1]["weights"]
    assert reference[0]["wrapped"] == "RecordingMLP" and reference[0]["weights"] != reference[1]["weights"]


@pytest.mark.slow
def test_a_read_failure_on_the_first_process_is_raised_on_every_process(launches):
    first, other = (launches["ours"][rank].get("failing_error", "") for rank in range(2))
    assert first.startswith("OSError") and "example 7" in first
    assert other.startswith("RuntimeError") and "first process failed" in other and "example 7" in other


def test_joining_and_slicing_keep_the_structure():
    batches = [{"a": torch.arange(2), "b": (torch.ones(2, 3),)}, {"a": torch.arange(2, 4), "b": (torch.zeros(2, 3),)}]
    joined = concatenate(batches)
    assert joined["a"].tolist() == [0, 1, 2, 3] and isinstance(joined["b"], tuple) and joined["b"][0].shape == (4, 3)
    assert batch_size_of(joined) == 4
    part = slice_batch(joined, slice(2, 4))
    assert part["a"].tolist() == [2, 3] and part["b"][0].tolist() == [[0.0] * 3] * 2


def test_a_field_that_is_not_a_tensor_is_named():
    with pytest.raises(TypeError, match=r"str at \['text'\]"):
        concatenate([{"text": "a"}, {"text": "b"}])


def test_batches_of_different_sizes_say_how_to_deal_them():
    with pytest.raises(RuntimeError, match="dispatch_batches': False"):
        concatenate([torch.zeros(2, 3), torch.zeros(2, 4)])


def test_a_shard_keeps_its_slice_of_each_global_batch_and_completes_the_tail():
    shards = [list(IterableDatasetShard(range(7), batch_size=2, num_processes=2, process_index=r)) for r in range(2)]
    assert shards == [[0, 1, 4, 5], [2, 3, 6, 0]]
    split = [list(IterableDatasetShard(range(8), 4, num_processes=2, process_index=r, split_batches=True)) for r in (0, 1)]
    assert split == [[0, 1, 4, 5], [2, 3, 6, 7]]
    dropped = list(IterableDatasetShard(range(7), batch_size=2, drop_last=True, num_processes=2, process_index=1))
    assert dropped == [2, 3]


def test_split_batches_needs_a_batch_size_the_processes_divide():
    with pytest.raises(ValueError, match="per_device_train_batch_size to a multiple of 2"):
        IterableDatasetShard(range(8), batch_size=3, num_processes=2, split_batches=True)
