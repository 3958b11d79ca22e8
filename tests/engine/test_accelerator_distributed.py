"""`trainer.accelerator` under `torchrun --nproc_per_node=2` (gloo, CPU) against accelerate's in the same launch.

Two launches of tests/distributed/accelerator_script.py run side by side, one with hf_lightning and one with
transformers (whose accelerator is accelerate's); every rank makes the same calls and must get the same results:
gather / gather_for_metrics with an uneven last round, reduce, pad_across_processes, broadcast,
split_between_processes, gather_object, main_process_first ordering, a prepared DataLoader, and what a
`compute_loss` override sees during training and evaluation. The differences are docs/divergences.md's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed.accelerator_script import NUM_TRAIN
from tests.distributed.launching import side_by_side

pytestmark = pytest.mark.slow  # two 2-process launches

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "distributed" / "accelerator_script.py"
DIVERGENT = ("gather_for_metrics_after_train",)


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """Per side, what each rank reported; both launches run at the same time."""
    return side_by_side(SCRIPT, tmp_path_factory.mktemp("accelerator_distributed"), timeout=600)


def _comparable(result: dict) -> dict:
    result = {key: value for key, value in result.items() if key not in DIVERGENT}
    result["facts_after"] = {
        k: v for k, v in result["facts_after"].items() if k not in ("end_of_dataloader", "remainder")
    }
    result["collectives"] = {k: v for k, v in result["collectives"].items() if k != "split_tuple_True"}
    return result


def test_every_rank_gets_accelerates_results(launches):
    for rank, (ours, reference) in enumerate(zip(launches["ours"], launches["reference"])):
        assert _comparable(ours) == _comparable(reference), rank


def test_the_collectives_are_really_across_processes(launches):
    """What the comparison covers: concatenation in rank order, reductions, padding and the launch order."""
    for rank, ours in enumerate(launches["ours"]):
        facts, collectives = ours["facts_before"], ours["collectives"]
        assert (facts["num_processes"], facts["process_index"], facts["distributed_type"]) == (
            2,
            rank,
            "MULTI_CPU",
        )
        assert ours["at_init"]["num_processes"] == 2 and ours["at_init"]["is_main_process"] is (rank == 0)
        assert collectives["gather"] == ("int64", [0, 10, 1, 11])
        assert collectives["gather_0d"] == ("float32", [0.0, 1.0])
        assert collectives["reduce_sum"] == ("float32", [3.0, 4.0])
        assert collectives["reduce_max"] == ("float32", [2.0, 2.0])
        assert collectives["pad_dim1"] == ("float32", [[1.0] * (rank + 1) + [-1.0] * (1 - rank)] * 2)
        assert collectives["broadcast_last"] == ("float32", [1.0])
        assert collectives["gather_object"] == ["rank0", {"r": 0}, "rank1", {"r": 1}]
        assert collectives["split_list_False"] == (["a", "b", "c"] if rank == 0 else ["d", "e"])
        assert collectives["split_short_True"] == ["only"]
        assert collectives["main_process_first_order"] == ["0", "1", "local0", "local1"]
        assert collectives["print"] == ("printed 0\n" if rank == 0 else "")


def test_gather_for_metrics_drops_the_repeated_samples_like_accelerate(launches):
    """11 samples, 2 processes of 2: the last round holds 3 real samples and one repeat of sample 0, dropped by
    gather_for_metrics in the last window of each epoch; the prepared 7-row loader's last round keeps 3 of 4."""
    ours = launches["ours"][0]
    last = [record for record in ours["train_records"] if record["training"] and record["end_of_dataloader"]]
    assert last and all(record["remainder"] == NUM_TRAIN % 4 for record in last)
    assert [len(record["labels"][1]) for record in last] == [3, 3]
    assert [row["gathered"][1] for row in ours["prepared_loader"][:-1]] == [
        [0.0, 1.0, 2.0, 3.0],
        [4.0, 5.0, 6.0],
    ]


def test_divergences_under_two_processes(launches):
    """Padding a tuple share raises TypeError in accelerate (it adds a list to the tuple); ours pads it. After
    train(), accelerate cuts a gather outside any loop to the finished train loader's remainder; ours does not."""
    for rank, (ours, reference) in enumerate(zip(launches["ours"], launches["reference"])):
        assert reference["collectives"]["split_tuple_True"].startswith("TypeError")
        assert ours["collectives"]["split_tuple_True"] == ((0, 1) if rank == 0 else (2, 2))
        assert len(reference["gather_for_metrics_after_train"][1]) == NUM_TRAIN % 4
        assert ours["gather_for_metrics_after_train"] == ("float32", [0.0, 1.0, 2.0] * 2)
