"""A resume into an IterableDataset's epoch: with a collator known to draw no random numbers the skipped batches'
examples are drawn but not collated (the cost is the dataset's own iteration); any other collator is called for
every skipped batch, as the reference replays them. Either way the batches that follow are the same."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import IterableDataset, default_collate

from hf_lightning.data.collate import (
    RemoveColumnsCollator,
    collates_without_side_effects,
    default_data_collator,
)
from hf_lightning.data.dataloaders import HFDataLoader


class Examples(IterableDataset):
    def __init__(self, count: int):
        self.count = count
        self.drawn = 0

    def __iter__(self):
        for index in range(self.count):
            self.drawn += 1
            yield {"x": torch.tensor([float(index)])}


class Counting:
    """Wraps a collator and counts its calls (a user's callable: not known to be free of side effects)."""

    def __init__(self, collate):
        self.collate, self.calls = collate, 0

    def __call__(self, features):
        self.calls += 1
        return self.collate(features)


def _batches(loader: HFDataLoader, skip: int) -> list[list[float]]:
    loader.skip_first_batches_once(skip)
    return [batch["x"].flatten().tolist() for batch in loader]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("count", "skip"), [(10, 1), (10, 2), (10, 3), (8, 2), (9, 3), (4, 5)])
def test_skipping_without_collating_gives_the_replays_batches(count, skip, drop_last):
    replayed_collate = Counting(default_data_collator)
    replayed = _batches(HFDataLoader(Examples(count), batch_size=4, collate_fn=replayed_collate, drop_last=drop_last), skip)
    fast_loader = HFDataLoader(Examples(count), batch_size=4, collate_fn=default_data_collator, drop_last=drop_last)
    assert _batches(fast_loader, skip) == replayed
    full = -(-count // 4) if not drop_last else count // 4
    assert replayed_collate.calls == min(full, skip) + len(replayed)  # the user's collator saw every batch
    # The next epoch of the same loader starts from the beginning again.
    assert _batches(fast_loader, 0)[0] == [0.0, 1.0, 2.0, 3.0]


def test_the_skipped_examples_are_drawn_but_not_collated(monkeypatch):
    dataset = Examples(40)
    collate = Counting(default_data_collator)
    loader = HFDataLoader(dataset, batch_size=4, collate_fn=RemoveColumnsCollator(collate, signature_columns=["x"]))
    assert _batches(loader, 3)[0] == [12.0, 13.0, 14.0, 15.0]
    assert collate.calls == 10  # a user's collator: the 3 skipped batches are collated (replayed), then 7
    monkeypatch.setattr(
        "hf_lightning.data.batch_skipping.collates_without_side_effects", lambda fn: fn.data_collator is collate
    )
    collate.calls, dataset.drawn = 0, 0
    assert _batches(loader, 3)[0] == [12.0, 13.0, 14.0, 15.0]
    assert collate.calls == 7 and dataset.drawn == 40  # every example drawn, only the yielded batches collated


def test_collators_known_to_have_no_side_effects():
    from transformers import DataCollatorForLanguageModeling, DataCollatorWithPadding
    from transformers import default_data_collator as transformers_default

    assert collates_without_side_effects(default_data_collator)
    assert collates_without_side_effects(default_collate)
    assert collates_without_side_effects(transformers_default)
    assert collates_without_side_effects(DataCollatorWithPadding(tokenizer=None))
    assert not collates_without_side_effects(DataCollatorForLanguageModeling(tokenizer=_StubTokenizer(), mlm=False))
    assert not collates_without_side_effects(lambda features: features)


class _StubTokenizer:
    """Enough of a tokenizer for DataCollatorForLanguageModeling's constructor (mlm=False)."""

    mask_token = None
    pad_token = "<pad>"
