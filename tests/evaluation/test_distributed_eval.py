"""evaluate() / predict() under `torchrun --nproc_per_node=2` (gloo, CPU) against the reference in the same launch.

Two launches of tests/distributed/eval_script.py run side by side, one with hf_lightning and one with
transformers; a single-process hf_lightning run in this process gives the rows every rank must return.
EVAL-2.9 / EVAL-2.10.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.distributed.eval_script import (
    EVAL_BATCH_SIZE,
    NUM_SAMPLES,
    TaggingData,
    make_model,
    pad_collate,
    run,
)
from tests.distributed.launching import WORLD_SIZE, side_by_side

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "distributed" / "eval_script.py"
# Keys whose values depend on the machine's speed.
TIMING_SUFFIXES = ("_runtime", "_samples_per_second", "_steps_per_second", "_model_preparation_time")


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """Per side, what each rank returned; both launches run at the same time."""
    return side_by_side(SCRIPT, tmp_path_factory.mktemp("distributed_eval"), timeout=300)


@pytest.fixture(scope="module")
def single_process(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run("ours", str(tmp_path_factory.mktemp("single_process")))


def _assert_rows_equal(predictions: np.ndarray, expected: np.ndarray, labels: np.ndarray) -> None:
    """Equal rows. Under 2 processes sample 36 is batched with the repeats [0, 1, 2], so its batch is wider than
    in a single process and the columns past its own length hold logits of the pad token instead of -100:
    that row is compared on its real tokens only (the reference behaves the same)."""
    assert predictions.shape == expected.shape
    np.testing.assert_allclose(predictions[:-1], expected[:-1], rtol=0, atol=1e-6)
    real = labels[-1] != -100
    np.testing.assert_allclose(predictions[-1][real], expected[-1][real], rtol=0, atol=1e-6)


def _without_timings(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.endswith(TIMING_SUFFIXES)}


def test_every_rank_predicts_exactly_the_single_process_rows(launches, single_process):
    for rank, result in enumerate(launches["ours"]):
        assert result["world_size"] == WORLD_SIZE
        assert result["predictions"].shape == single_process["predictions"].shape == (NUM_SAMPLES, 9, 3), rank
        _assert_rows_equal(result["predictions"], single_process["predictions"], single_process["label_ids"])
        np.testing.assert_array_equal(result["label_ids"], single_process["label_ids"])
        # The padding across processes and across batches is -100, as in a single process.
        assert (result["label_ids"] == -100).any() and (result["predictions"] == -100).any()


def test_predictions_and_metrics_equal_the_reference_launch(launches):
    for ours, reference in zip(launches["ours"], launches["reference"]):
        np.testing.assert_allclose(ours["predictions"], reference["predictions"], rtol=0, atol=1e-6)
        np.testing.assert_array_equal(ours["label_ids"], reference["label_ids"])
        for key in ("eval_metrics", "test_metrics"):
            assert list(ours[key]) == list(reference[key]), key
            ours_values, reference_values = _without_timings(ours[key]), _without_timings(reference[key])
            assert ours_values.keys() == reference_values.keys()
            for name, value in ours_values.items():
                assert math.isclose(value, reference_values[name], rel_tol=1e-7, abs_tol=1e-9), (key, name)
        assert ours["eval_metrics"]["eval_rows"] == NUM_SAMPLES


def test_eval_loss_weights_the_padded_last_round_like_the_reference(launches, single_process):
    """Each batch loss counts `eval_batch_size` times and the gathered last round is cut to 37 % 8 = 5 entries:
    rank 0's last batch (4 real samples) counts 4 times and rank 1's batch [36, 0, 1, 2], padded with repeats,
    once. The result differs from the single-process loss, where the last batch is [36] alone."""
    data, model = TaggingData(), make_model()
    with torch.no_grad():
        batches = [
            list(range(i, min(i + EVAL_BATCH_SIZE, NUM_SAMPLES))) for i in range(0, 36, EVAL_BATCH_SIZE)
        ]
        losses = [model(**pad_collate([data[i] for i in batch]))["loss"].item() for batch in batches]
        padded_last = model(**pad_collate([data[i] for i in (36, 0, 1, 2)]))["loss"].item()
    expected = (EVAL_BATCH_SIZE * sum(losses) + padded_last) / NUM_SAMPLES
    for ours, reference in zip(launches["ours"], launches["reference"]):
        assert ours["eval_metrics"]["eval_loss"] == reference["eval_metrics"]["eval_loss"]
        assert math.isclose(ours["eval_metrics"]["eval_loss"], expected, rel_tol=1e-6)
        assert ours["test_metrics"]["test_loss"] == reference["test_metrics"]["test_loss"]
    assert not math.isclose(single_process["eval_metrics"]["eval_loss"], expected, rel_tol=1e-6)


def test_each_rank_reads_a_disjoint_share(launches):
    """Rank 0 reads batches 0, 2, ..., 8 and rank 1 batches 1, 3, ..., 9; rank 1's last batch is completed with
    samples 0, 1, 2 (read twice, dropped from the results)."""
    ours_reads = [result["eval_reads"] for result in launches["ours"]]
    assert ours_reads == [result["eval_reads"] for result in launches["reference"]]
    rank0, rank1 = ours_reads
    assert rank1[-3:] == [0, 1, 2]
    real1 = rank1[:-3]
    assert not set(rank0) & set(real1)
    assert sorted(rank0 + real1) == list(range(NUM_SAMPLES))


def test_seq2seq_loss_is_the_reference_and_rows_are_not_duplicated(launches, single_process):
    """The reference's Seq2SeqTrainer gathers without dropping the sampler's repeats: 40 rows, the last three
    repeating samples 0-2, and a loss that counts every repeat. We keep its loss but return exactly 37 rows
    (docs/divergences.md)."""
    for ours, reference in zip(launches["ours"], launches["reference"]):
        assert ours["seq2seq_eval_metrics"]["eval_loss"] == reference["seq2seq_eval_metrics"]["eval_loss"]
        assert ours["seq2seq_test_loss"] == reference["seq2seq_test_loss"]
        reference_rows = np.asarray(reference["seq2seq_predictions"])
        reference_labels = np.asarray(reference["seq2seq_label_ids"])
        assert reference_rows.shape[0] == reference_labels.shape[0] == NUM_SAMPLES + 3
        real = reference_labels[:3] != -100
        np.testing.assert_array_equal(reference_labels[NUM_SAMPLES:], reference_labels[:3])
        np.testing.assert_allclose(reference_rows[NUM_SAMPLES:][real], reference_rows[:3][real], atol=1e-6)
        _assert_rows_equal(
            np.asarray(ours["seq2seq_predictions"]),
            single_process["predictions"],
            single_process["label_ids"],
        )
        np.testing.assert_array_equal(ours["seq2seq_label_ids"], single_process["label_ids"])


def test_uneven_eval_shards_are_refused(monkeypatch):
    from hf_lightning import TrainingArguments
    from hf_lightning.strategies.distributed import check_even_eval_shards
    from hf_lightning.translation.translate import translate

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    args = TrainingArguments(
        output_dir="unused",
        use_cpu=True,
        per_device_eval_batch_size=4,
        accelerator_config={"even_batches": False},
    )
    uneven = translate(args, raise_on_refusal=False).module
    with pytest.raises(ValueError, match="even_batches=False with 37 evaluation samples"):
        check_even_eval_shards(args, TaggingData(), uneven)
    check_even_eval_shards(args, list(range(16)), uneven)  # 16 = 2 rounds of 2 x 4: every process gets the same batches
    args.accelerator_config.even_batches = True
    check_even_eval_shards(args, TaggingData(), translate(args, raise_on_refusal=False).module)


def test_a_launch_without_rendezvous_variables_is_refused(monkeypatch):
    from hf_lightning import TrainingArguments
    from hf_lightning.strategies.distributed import ensure_process_group

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    args = TrainingArguments(output_dir="unused", use_cpu=True)
    assert not torch.distributed.is_initialized()
    with pytest.raises(ValueError, match="MASTER_ADDR and MASTER_PORT are not set"):
        ensure_process_group(args)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert ensure_process_group(TrainingArguments(output_dir="unused", use_cpu=True)) is False
