"""Samplers against the reference's (accelerate / transformers) and its recorded orders (R3.2-R3.6)."""

from __future__ import annotations

import random

import pytest
import torch
from accelerate.data_loader import BatchSamplerShard as RefBatchSamplerShard
from accelerate.data_loader import SeedableRandomSampler as RefSeedableRandomSampler
from torch.utils.data import BatchSampler, SequentialSampler
from transformers.trainer_pt_utils import BatchRebalanceSampler as RefBatchRebalanceSampler
from transformers.trainer_pt_utils import LengthGroupedSampler as RefLengthGroupedSampler
from transformers.trainer_pt_utils import get_length_grouped_indices as ref_get_length_grouped_indices

from hf_lightning.data.samplers import (
    BatchRebalanceSampler,
    BatchSamplerShard,
    LengthGroupedSampler,
    SeedableRandomSampler,
    get_length_grouped_indices,
    shard_batches,
)

# R3.2, 10 items.
SEED_42_ORDERS = [
    [2, 6, 1, 8, 4, 5, 0, 9, 3, 7],
    [8, 4, 9, 0, 5, 1, 6, 7, 2, 3],
    [2, 6, 3, 8, 7, 9, 1, 4, 5, 0],
]
DATA_SEED_7_ORDERS = [[5, 0, 3, 4, 1, 7, 9, 6, 8, 2], [3, 5, 0, 1, 2, 6, 4, 7, 8, 9]]


def test_seedable_sampler_epochs_advance_by_themselves_like_accelerate():
    ours = SeedableRandomSampler(range(10), seed=42)
    ref = RefSeedableRandomSampler(range(10), data_seed=42)
    our_orders = [list(ours) for _ in range(3)]
    assert our_orders == SEED_42_ORDERS
    assert our_orders == [list(ref) for _ in range(3)]


def test_seedable_sampler_set_epoch_selects_the_permutation():
    sampler = SeedableRandomSampler(range(10), seed=7)
    orders = []
    for epoch in (0, 1, 2):
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    assert orders[:2] == DATA_SEED_7_ORDERS
    assert orders[2] == torch.randperm(10, generator=torch.Generator().manual_seed(9)).tolist()


def test_seedable_sampler_reads_initial_seed_at_construction_and_leaves_global_rng_alone():
    torch.manual_seed(42)
    sampler = SeedableRandomSampler(range(10))
    torch.manual_seed(5)  # a later reseed must not change the sampler's seed
    state = torch.get_rng_state()
    assert list(sampler) == SEED_42_ORDERS[0]
    assert torch.equal(torch.get_rng_state(), state)


def test_abandoned_iteration_does_not_advance_the_epoch():
    ours, ref = SeedableRandomSampler(range(10), seed=3), RefSeedableRandomSampler(range(10), data_seed=3)
    for sampler in (ours, ref):
        iterator = iter(sampler)
        next(iterator)
    assert ours.epoch == ref.epoch == 0


def test_seedable_sampler_draws_late_and_advances_on_the_exhausted_next_like_accelerate():
    ours, ref = SeedableRandomSampler(range(10), seed=3), RefSeedableRandomSampler(range(10), data_seed=3)
    seen = []
    for sampler in (ours, ref):
        iterator = iter(sampler)
        sampler.set_epoch(4)  # after iter(), before the first index: the draw still uses it
        drawn = [next(iterator) for _ in range(10)]
        epoch_after_last = sampler.epoch
        assert next(iterator, None) is None and next(iterator, None) is None
        seen.append((drawn, epoch_after_last, sampler.epoch))
    assert seen[0] == seen[1]
    assert seen[0][1:] == (4, 5)


def _lengths(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(1, 64) for _ in range(n)]


@pytest.mark.parametrize("n,batch_size", [(40, 4), (7, 2), (400, 3), (1, 8)])
def test_length_grouped_indices_match_reference_with_global_rng(n, batch_size):
    lengths = _lengths(n, n)
    torch.manual_seed(n)
    ref = ref_get_length_grouped_indices(lengths, batch_size)
    ref_state = torch.get_rng_state()
    torch.manual_seed(n)
    ours = get_length_grouped_indices(lengths, batch_size)
    assert ours == ref
    assert torch.equal(torch.get_rng_state(), ref_state)  # same global-RNG consumption
    assert sorted(ours) == list(range(n))


def test_length_grouped_sampler_matches_reference_from_items_and_lengths():
    lengths = _lengths(40, 1)
    items = [{"input_ids": [0] * length} for length in lengths]
    for kwargs in ({"dataset": items}, {"lengths": torch.tensor(lengths)}, {"lengths": lengths}):
        torch.manual_seed(42)
        ref = [list(RefLengthGroupedSampler(4, **kwargs)) for _ in range(2)]
        torch.manual_seed(42)
        ours = [list(LengthGroupedSampler(4, **kwargs)) for _ in range(2)]
        assert ours == ref
    ref_g = list(RefLengthGroupedSampler(2, lengths=lengths, generator=torch.Generator().manual_seed(3)))
    ours_g = list(LengthGroupedSampler(2, lengths=lengths, generator=torch.Generator().manual_seed(3)))
    assert ours_g == ref_g


def test_length_grouped_sampler_refuses_items_without_the_input_key():
    with pytest.raises(ValueError, match="'tokens' key"):
        LengthGroupedSampler(2, dataset=[{"input_ids": [1]}], model_input_name="tokens")
    with pytest.raises(ValueError, match="'input_ids' key"):
        LengthGroupedSampler(2, dataset=[[1, 2]])


REBALANCE_CASES = [
    # n, effective batch, dp, ga, drop_last, rank
    (64, 16, 1, 1, True, 0),
    (64, 16, 2, 2, True, 1),
    (70, 16, 2, 2, False, 0),
    (67, 12, 2, 3, False, 1),
    (5, 8, 2, 2, False, 1),  # tail chunk smaller than dp * ga: padded from the epoch order
    (200, 32, 4, 2, True, 3),
]


@pytest.mark.parametrize("n,effective,dp,ga,drop_last,rank", REBALANCE_CASES)
def test_batch_rebalance_sampler_matches_reference(n, effective, dp, ga, drop_last, rank):
    lengths = _lengths(n, effective + n)
    kwargs = dict(
        lengths=lengths,
        effective_batch_size=effective,
        dp_size=dp,
        grad_accum=ga,
        rank=rank,
        drop_last=drop_last,
    )
    ours, ref = BatchRebalanceSampler(**kwargs), RefBatchRebalanceSampler(**kwargs)
    assert len(ours) == len(ref)
    for epoch in (0, 1):
        ours.set_epoch(epoch)
        ref.set_epoch(epoch)
        our_batches = list(ours)
        assert our_batches == list(ref)
        assert len(our_batches) == len(ours)


def test_batch_rebalance_sampler_extreme_lengths_match_reference():
    # Very unequal lengths drive groups down to one sample: exercises the freeze/relieve path.
    lengths = [2000, 1900, 1800] + [3] * 29
    kwargs = dict(lengths=lengths, effective_batch_size=32, dp_size=2, grad_accum=2, rank=0)
    assert list(BatchRebalanceSampler(**kwargs)) == list(RefBatchRebalanceSampler(**kwargs))
    assert list(BatchRebalanceSampler(**kwargs, seed=5)) == list(RefBatchRebalanceSampler(**kwargs, seed=5))


def test_batch_rebalance_sampler_rejects_impossible_sizes():
    with pytest.raises(ValueError, match="effective_batch_size"):
        BatchRebalanceSampler([1, 2, 3], effective_batch_size=2, dp_size=2, grad_accum=2)


def _seeded_batches(n: int, batch_size: int, drop_last: bool, seed: int) -> BatchSampler:
    return BatchSampler(SeedableRandomSampler(range(n), seed=seed), batch_size, drop_last)


def _ref_seeded_batches(n: int, batch_size: int, drop_last: bool, seed: int) -> BatchSampler:
    return BatchSampler(RefSeedableRandomSampler(range(n), data_seed=seed), batch_size, drop_last)


def _two_epochs(shard) -> list[list[list[int]]]:
    epochs = []
    for epoch in (0, 1):
        shard.batch_sampler.sampler.set_epoch(epoch)
        epochs.append([list(b) for b in shard])
    return epochs


def test_spec_example_whole_batches_dealt_round_robin_with_refill():
    # R3.4: 10 items, batch 2, W 2, seed 42.
    expected = {
        0: [[[2, 6], [4, 5], [3, 7]], [[8, 4], [5, 1], [2, 3]]],
        1: [[[1, 8], [0, 9], [2, 6]], [[9, 0], [6, 7], [8, 4]]],
    }
    for rank in (0, 1):
        shard = shard_batches(_seeded_batches(10, 2, False, 42), num_processes=2, process_index=rank)
        assert _two_epochs(shard) == expected[rank]
        assert len(shard) == 3


SHARD_CASES = [
    # n, batch, W, drop_last, even_batches, split_batches
    (10, 2, 2, False, True, False),
    (10, 2, 2, False, False, False),
    (10, 2, 2, True, True, False),
    (11, 3, 2, False, True, False),
    (11, 3, 2, False, False, False),
    (3, 2, 4, False, True, False),  # fewer samples than one round
    (13, 4, 3, False, True, False),
    (12, 4, 2, False, True, True),
    (10, 4, 2, False, True, True),
    (10, 4, 2, False, False, True),
    (3, 4, 2, False, True, True),
]


@pytest.mark.parametrize("n,batch_size,world,drop_last,even,split", SHARD_CASES)
def test_shard_batches_matches_accelerate(n, batch_size, world, drop_last, even, split):
    for rank in range(world):
        ours = shard_batches(
            _seeded_batches(n, batch_size, drop_last, 42), world, rank, even_batches=even, split_batches=split
        )
        ref = RefBatchSamplerShard(
            _ref_seeded_batches(n, batch_size, drop_last, 42),
            world,
            rank,
            split_batches=split,
            even_batches=even,
        )
        assert _two_epochs(ours) == _two_epochs(ref)
        assert len(ours) == len(ref)


@pytest.mark.parametrize("even", [True, False])
def test_shard_batches_with_variable_size_batches_matches_accelerate(even):
    # A batch sampler without `batch_size` (like batch_rebalance) is dealt as whole, dynamic batches.
    batches = [[0, 1, 2], [3], [4, 5], [6, 7, 8, 9], [10]]
    for rank in range(3):
        ours = BatchSamplerShard(batches, 3, rank, even_batches=even)
        ref = RefBatchSamplerShard(batches, 3, rank, even_batches=even)
        assert list(ours) == list(ref)
        assert len(ours) == len(ref)


def test_shard_batches_refuses_bad_arguments():
    with pytest.raises(ValueError, match="process_index=2"):
        shard_batches(BatchSampler(SequentialSampler(range(4)), 2, False), 2, 2)
    with pytest.raises(ValueError, match="split_batches"):
        shard_batches(BatchSampler(SequentialSampler(range(4)), 3, False), 2, 0, split_batches=True)
