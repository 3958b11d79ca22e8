"""DataLoaders built by hf_lightning against `transformers.Trainer`'s (R3.1-R3.12).

Both sides read the same `transformers.TrainingArguments` object, so any difference is ours.
"""

from __future__ import annotations

import functools
import itertools
import random

import datasets
import numpy as np
import pytest
import torch
import transformers
from accelerate.data_loader import prepare_data_loader
from torch.utils.data import DataLoader, IterableDataset, RandomSampler
from transformers import BertForQuestionAnswering, BertForSequenceClassification, Trainer
from transformers.trainer_pt_utils import BatchRebalanceSampler as RefBatchRebalanceSampler
from transformers.trainer_pt_utils import LengthGroupedSampler as RefLengthGroupedSampler
from transformers.trainer_pt_utils import get_length_grouped_indices as ref_get_length_grouped_indices
from transformers.utils.generic import can_return_loss as ref_can_return_loss

from hf_lightning.core.seeding import set_seed
from hf_lightning.data.dataloaders import (
    num_examples,
    seed_worker,
    set_train_epoch,
)
from hf_lightning.data.model_inputs import (
    can_return_loss,
    infer_label_names,
    model_accepts_loss_kwargs,
    signature_columns,
)
from tests.data.loader_builders import build_eval_dataloader, build_train_dataloader, context_without_trainer
from tests.models import make_tiny_bert_classifier, tiny_bert_config

SEED_42_ORDERS = [
    [2, 6, 1, 8, 4, 5, 0, 9, 3, 7],
    [8, 4, 9, 0, 5, 1, 6, 7, 2, 3],
    [2, 6, 3, 8, 7, 9, 1, 4, 5, 0],
]
DATA_SEED_7_ORDERS = [[5, 0, 3, 4, 1, 7, 9, 6, 8, 2], [3, 5, 0, 1, 2, 6, 4, 7, 8, 9]]


@pytest.fixture
def make_args(make_args):
    """The shared factory with this file's quiet run: no saves, no logs, no progress bar, batches of 2."""
    return functools.partial(
        make_args,
        disable_tqdm=True,
        save_strategy="no",
        logging_strategy="no",
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
    )


class IdxModel(torch.nn.Module):
    """Records each batch's `idx` and one `torch.rand(1)` (the dropout stream) in `forward`."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.seen: list[list[int]] = []
        self.draws: list[float] = []

    def forward(self, idx, x=None, input_ids=None, labels=None):
        self.seen.append(idx.tolist() if isinstance(idx, torch.Tensor) else list(idx))
        self.draws.append(torch.rand(1).item())
        return {"loss": self.weight.sum() * 0.0 + self.weight.sum()}


def idx_items(n: int) -> list[dict]:
    return [{"idx": i, "x": float(i)} for i in range(n)]


def our_epochs(dataloader, epochs: int, model: IdxModel | None = None) -> list[list[int]]:
    """Iterate like the reference's loop: `set_epoch` then a full pass; optionally 'forward' each batch."""
    seen = []
    for epoch in range(epochs):
        set_train_epoch(dataloader, epoch)
        for batch in dataloader:
            if model is not None:
                model(**batch)
            else:
                seen.append(batch["idx"].tolist() if isinstance(batch, dict) else list(batch))
    return model.seen if model is not None else seen


def ref_epochs(dataloader, epochs: int) -> list[list[int]]:
    """Iterate a reference loader the way `Trainer._inner_training_loop` does at each epoch start."""
    seen = []
    for epoch in range(epochs):
        dataloader.set_epoch(epoch)
        for batch in dataloader:
            seen.append(batch["idx"].tolist() if isinstance(batch, dict) else list(batch))
    return seen


@pytest.fixture(scope="module")
def tiny_bert():
    return make_tiny_bert_classifier()


# ---- R3.2 / R3.3: random order and global RNG consumption, against a real reference training run ----------


@pytest.mark.parametrize("seed,data_seed", [(42, None), (1, 7)])
def test_random_order_and_rng_stream_match_reference_training(make_args, seed, data_seed):
    args = make_args(num_train_epochs=3, seed=seed, data_seed=data_seed)
    ref_model = IdxModel()
    Trainer(model=ref_model, args=args, train_dataset=idx_items(10)).train()

    set_seed(seed)  # what the reference's constructor does
    our_model = IdxModel()
    loader = build_train_dataloader(
        idx_items(10), context_without_trainer(args=args, data_collator=None, model=our_model)
    )
    our_epochs(loader, 3, model=our_model)

    assert our_model.seen == ref_model.seen
    assert our_model.draws == ref_model.draws  # R3.3: one int64 draw per epoch, nothing else
    flat = [i for batch in our_model.seen for i in batch]
    expected = SEED_42_ORDERS if data_seed is None else DATA_SEED_7_ORDERS
    assert flat[: 10 * len(expected)] == [i for order in expected for i in order]


def test_random_collator_interleaves_with_forward_like_reference(make_args):
    # The reference's prepared loader collates one batch ahead; a collator drawing from the global RNG
    # (masking, for instance) must see the same stream as there.
    def drawing_collator(features):
        batch = transformers.default_data_collator(features)
        batch["x"] = batch["x"] + torch.rand(1)
        return batch

    args = make_args(num_train_epochs=2, seed=5)
    ref_model = IdxModel()
    Trainer(model=ref_model, args=args, train_dataset=idx_items(6), data_collator=drawing_collator).train()
    set_seed(5)
    our_model = IdxModel()
    loader = build_train_dataloader(
        idx_items(6), context_without_trainer(args=args, data_collator=drawing_collator, model=our_model)
    )
    our_epochs(loader, 2, model=our_model)
    assert our_model.seen == ref_model.seen
    assert our_model.draws == ref_model.draws


def test_only_one_int64_draw_per_epoch(make_args):
    args = make_args(seed=42)
    set_seed(42)
    model = IdxModel()
    loader = build_train_dataloader(idx_items(4), context_without_trainer(args=args, data_collator=None, model=model))
    our_epochs(loader, 2, model=model)
    assert model.draws == pytest.approx([0.38286, 0.95931, 0.25657, 0.79364], abs=1e-5)  # R3.3

    set_seed(42)
    simulated = []
    for _ in range(2):
        torch.empty((), dtype=torch.int64).random_()
        simulated += [torch.rand(1).item(), torch.rand(1).item()]
    assert model.draws == simulated

    set_seed(42)
    loader = build_train_dataloader(idx_items(4), context_without_trainer(args=args, data_collator=None, model=model))
    list(loader)
    after_epoch = torch.get_rng_state()
    set_seed(42)
    torch.empty((), dtype=torch.int64).random_()
    assert torch.equal(after_epoch, torch.get_rng_state())


def test_sampler_seed_is_the_initial_seed_at_build_time(make_args):
    args = make_args(seed=42)
    torch.manual_seed(3)  # a user reseed between construction and train() changes S (R3.2)
    loader = build_train_dataloader(
        idx_items(10), context_without_trainer(args=args, data_collator=None, model=IdxModel())
    )
    torch.manual_seed(42)
    expected = torch.randperm(10, generator=torch.Generator().manual_seed(3)).tolist()
    assert [i for batch in our_epochs(loader, 1) for i in batch] == expected


def test_sequential_strategy_and_drop_last(make_args):
    args = make_args(train_sampling_strategy="sequential", dataloader_drop_last=True, seed=42)
    loader = build_train_dataloader(
        idx_items(5), context_without_trainer(args=args, data_collator=None, model=IdxModel())
    )
    assert our_epochs(loader, 2) == [[0, 1], [2, 3]] * 2


# ---- R3.4: whole batches dealt to processes -----------------------------------------------------------------


@pytest.mark.parametrize("even_batches", [True, False])
def test_two_process_dealing_matches_accelerate(make_args, even_batches):
    args = make_args(seed=42, accelerator_config={"even_batches": even_batches})
    spec = {
        0: [[2, 6], [4, 5], [3, 7], [8, 4], [5, 1], [2, 3]],
        1: [[1, 8], [0, 9], [2, 6], [9, 0], [6, 7], [8, 4]],
    }
    for rank in (0, 1):
        set_seed(42)
        ours = build_train_dataloader(
            idx_items(10),
            context_without_trainer(args=args, data_collator=None, model=IdxModel(), world_size=2, process_index=rank),
        )
        items = idx_items(10)
        set_seed(42)
        ref = prepare_data_loader(
            DataLoader(
                items,
                batch_size=2,
                sampler=RandomSampler(items),
                collate_fn=transformers.default_data_collator,
            ),
            num_processes=2,
            process_index=rank,
            even_batches=even_batches,
            use_seedable_sampler=True,
        )
        our_batches = our_epochs(ours, 2)
        assert our_batches == ref_epochs(ref, 2)
        assert len(ours) == len(ref)
        if even_batches:
            assert our_batches == spec[rank]
        else:
            assert len(our_batches) == (6 if rank == 0 else 4)


def test_two_process_eval_is_sequential_batches_dealt_with_padding(make_args):
    args = make_args()
    items = idx_items(5)
    for rank in (0, 1):
        ours = build_eval_dataloader(
            items,
            context_without_trainer(args=args, data_collator=None, model=IdxModel(), world_size=2, process_index=rank),
        )
        ref = prepare_data_loader(
            DataLoader(items, batch_size=2, collate_fn=transformers.default_data_collator),
            num_processes=2,
            process_index=rank,
        )
        assert our_epochs(ours, 1) == ref_epochs(ref, 1)
    assert our_epochs(
        build_eval_dataloader(items, context_without_trainer(args=args, data_collator=None, model=IdxModel())), 1
    ) == [
        [0, 1],
        [2, 3],
        [4],
    ]


# ---- R3.5 / R3.6: length-aware strategies -------------------------------------------------------------------


def length_items(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"idx": i, "input_ids": [1] * rng.randint(1, 30)} for i in range(n)]


def collect_idx(features):
    return [f["idx"] for f in features]


def test_group_by_length_matches_reference_sampler_and_trainer(make_args):
    items = length_items(40)
    lengths = [len(item["input_ids"]) for item in items]
    args = make_args(seed=42, gradient_accumulation_steps=2, train_sampling_strategy="group_by_length")

    expected = []
    set_seed(42)
    for _ in range(2):
        torch.empty((), dtype=torch.int64).random_()  # the epoch's DataLoader base seed
        expected += ref_get_length_grouped_indices(lengths, 4)

    set_seed(42)
    ours = build_train_dataloader(items, context_without_trainer(args=args, data_collator=collect_idx, model=IdxModel()))
    our_order = [i for batch in our_epochs(ours, 2) for i in batch]
    assert our_order == expected

    trainer = Trainer(model=IdxModel(), args=args, train_dataset=items, data_collator=collect_idx)
    assert [i for batch in ref_epochs(trainer.get_train_dataloader(), 2) for i in batch] == expected


@pytest.mark.parametrize("remove_unused_columns", [True, False])
def test_length_column_is_read_after_column_removal_like_reference(make_args, remove_unused_columns):
    # `length` is not a forward argument: with column removal the reference drops it before reading it.
    items = length_items(24, seed=3)
    table = {
        "idx": [it["idx"] for it in items],
        "input_ids": [it["input_ids"] for it in items],
        "length": [31 - len(it["input_ids"]) for it in items],  # deliberately disagrees with input_ids
    }
    dataset = datasets.Dataset.from_dict(table)
    args = make_args(
        seed=42,
        train_sampling_strategy="group_by_length",
        remove_unused_columns=remove_unused_columns,
    )
    trainer = Trainer(model=IdxModel(), args=args, train_dataset=dataset, data_collator=collect_idx)
    ref = [i for batch in ref_epochs(trainer.get_train_dataloader(), 1) for i in batch]
    set_seed(42)
    ours = build_train_dataloader(
        dataset, context_without_trainer(args=args, data_collator=collect_idx, model=IdxModel())
    )
    assert [i for batch in our_epochs(ours, 1) for i in batch] == ref
    assert dataset.column_names == ["idx", "input_ids", "length"]  # the stored dataset keeps its columns


def test_group_by_length_eval_quirk_matches_reference(make_args):
    items = length_items(30, seed=1)
    args = make_args(seed=11, train_sampling_strategy="group_by_length", per_device_eval_batch_size=3)
    trainer = Trainer(model=IdxModel(), args=args, eval_dataset=items, data_collator=collect_idx)
    ref = ref_epochs(trainer.get_eval_dataloader(), 1)
    ours = our_epochs(
        build_eval_dataloader(items, context_without_trainer(args=args, data_collator=collect_idx, model=IdxModel())), 1
    )
    assert ours == ref
    expected = list(RefLengthGroupedSampler(3, dataset=items, generator=torch.Generator().manual_seed(11)))
    assert [i for batch in ours for i in batch] == expected


def test_batch_rebalance_ignores_seeds_and_matches_reference(make_args):
    items = length_items(37, seed=2)
    lengths = [len(item["input_ids"]) for item in items]
    args = make_args(
        seed=7,
        data_seed=9,
        gradient_accumulation_steps=2,
        per_device_train_batch_size=4,
        train_sampling_strategy="batch_rebalance",
    )
    sampler = RefBatchRebalanceSampler(
        lengths, effective_batch_size=8, dp_size=1, grad_accum=2, drop_last=False
    )
    expected = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        expected += list(sampler)

    set_seed(7)
    ours = our_epochs(
        build_train_dataloader(items, context_without_trainer(args=args, data_collator=collect_idx, model=IdxModel())), 2
    )
    assert ours == expected
    trainer = Trainer(model=IdxModel(), args=args, train_dataset=items, data_collator=collect_idx)
    assert ref_epochs(trainer.get_train_dataloader(), 2) == expected


def test_batch_rebalance_is_not_resharded_across_processes(make_args):
    items = length_items(40, seed=4)
    lengths = [len(item["input_ids"]) for item in items]
    args = make_args(seed=42, train_sampling_strategy="batch_rebalance", gradient_accumulation_steps=2)
    for rank in (0, 1):
        ours = build_train_dataloader(
            items,
            context_without_trainer(
                args=args, data_collator=collect_idx, model=IdxModel(), world_size=2, process_index=rank
            ),
        )
        sampler = RefBatchRebalanceSampler(
            lengths, effective_batch_size=8, dp_size=2, grad_accum=2, rank=rank, drop_last=False
        )
        sampler.set_epoch(1)
        set_train_epoch(ours, 1)
        assert [list(b) for b in ours] == list(sampler)


# ---- R3.11 / R3.12: columns and labels ---------------------------------------------------------------------


def column_table(n: int = 6) -> dict:
    return {
        "input_ids": [[2, 5 + i, 7, 3] for i in range(n)],
        "label": [i % 2 for i in range(n)],
        "text": [f"t{i}" for i in range(n)],
        "idx": list(range(n)),
        "label_ids": [1 - i % 2 for i in range(n)],
    }


def test_unused_columns_removed_like_reference(make_args, tiny_bert):
    table = column_table()
    dataset = datasets.Dataset.from_dict(table)
    args = make_args(train_sampling_strategy="sequential")
    ref_batch = next(iter(Trainer(model=tiny_bert, args=args, train_dataset=dataset).get_train_dataloader()))
    ours = build_train_dataloader(dataset, context_without_trainer(args=args, data_collator=None, model=tiny_bert))
    our_batch = next(iter(ours))
    assert set(our_batch) == set(ref_batch) == {"labels", "input_ids"}
    for key in ref_batch:
        assert torch.equal(our_batch[key], ref_batch[key])
    assert "text" in dataset.column_names

    as_dicts = [{k: table[k][i] for k in table} for i in range(6)]
    dict_batch = next(
        iter(build_train_dataloader(as_dicts, context_without_trainer(args=args, data_collator=None, model=tiny_bert)))
    )
    assert set(dict_batch) == {"labels", "input_ids"}
    for key in ref_batch:
        assert torch.equal(dict_batch[key], ref_batch[key])


def test_nothing_matching_the_signature_raises(make_args, tiny_bert):
    dataset = datasets.Dataset.from_dict({"foo": [1, 2], "bar": [3, 4]})
    args = make_args()
    with pytest.raises(ValueError, match="No columns in the dataset match"):
        Trainer(model=tiny_bert, args=args, train_dataset=dataset).get_train_dataloader()
    with pytest.raises(ValueError, match=r"No columns in the dataset match.*\(input_ids, attention_mask"):
        build_train_dataloader(dataset, context_without_trainer(args=args, data_collator=None, model=tiny_bert))


def test_remove_unused_columns_false_keeps_everything(make_args, tiny_bert):
    dataset = datasets.Dataset.from_dict({"input_ids": [[1, 2]] * 2, "idx": [0, 1], "label": [0, 1]})
    args = make_args(remove_unused_columns=False, train_sampling_strategy="sequential")
    batch = next(
        iter(build_train_dataloader(dataset, context_without_trainer(args=args, data_collator=None, model=tiny_bert)))
    )
    assert set(batch) == {"labels", "input_ids", "idx"}


def test_signature_columns_match_reference(make_args, tiny_bert):
    trainer = Trainer(model=tiny_bert, args=make_args())
    trainer._set_signature_columns_if_needed()
    ours = signature_columns(tiny_bert, infer_label_names(tiny_bert))
    assert sorted(ours) == sorted(trainer._signature_columns)
    assert ours[: len(ours) - 2] == trainer._signature_columns[: len(ours) - 2]


def test_label_names_and_loss_flags_match_reference(make_args):
    torch.manual_seed(0)
    sequence = BertForSequenceClassification(tiny_bert_config())
    qa = BertForQuestionAnswering(tiny_bert_config())
    assert infer_label_names(sequence) == ["labels"]
    assert infer_label_names(qa) == ["start_positions", "end_positions"]

    class Plain(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, labels=None):
            return {}

    class WithKwargs(torch.nn.Module):
        def forward(self, input_ids, return_loss=True, **kwargs):
            return {}

    class Declares(WithKwargs):
        accepts_loss_kwargs = False

    for model in (sequence, qa, Plain(), WithKwargs(), Declares()):
        trainer = Trainer(model=model, args=make_args())
        assert infer_label_names(model) == trainer.label_names
        assert model_accepts_loss_kwargs(model) == trainer.model_accepts_loss_kwargs
        assert can_return_loss(model) == trainer.can_return_loss == ref_can_return_loss(type(model))
    assert can_return_loss(WithKwargs()) and not can_return_loss(sequence)
    assert model_accepts_loss_kwargs(WithKwargs()) and not model_accepts_loss_kwargs(Declares())
    assert not model_accepts_loss_kwargs(Plain())


# ---- R3.7: epochs reach iterable datasets ------------------------------------------------------------------


class EpochIterable(IterableDataset):
    def __init__(self) -> None:
        self.calls: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.calls.append(epoch)

    def __iter__(self):
        return iter([{"idx": i, "x": float(i)} for i in range(3)])


def test_iterable_dataset_receives_epochs_like_reference(make_args):
    args = make_args(per_device_train_batch_size=1, max_steps=7)
    ref_dataset = EpochIterable()
    Trainer(model=IdxModel(), args=args, train_dataset=ref_dataset).train()

    ours = EpochIterable()
    loader = build_train_dataloader(ours, context_without_trainer(args=args, data_collator=None, model=IdxModel()))
    steps = 0
    for epoch in itertools.count():
        set_train_epoch(loader, epoch)
        for _batch in loader:
            steps += 1
            if steps == 7:
                break
        if steps == 7:
            break
    assert ours.calls == ref_dataset.calls == [0, 0, 1, 1, 2, 2]


def test_iterable_dataset_across_processes_is_dealt_for_training_and_evaluation(make_args):
    """Training and evaluation batches are dealt from the first process (tests/data/test_iterable_across_processes.py
    runs both on 2 processes); with dispatch_batches=False each process reads its shard."""
    from hf_lightning.data.dataloaders import DispatchingDataLoader

    loader = build_train_dataloader(
        EpochIterable(), context_without_trainer(args=make_args(), data_collator=None, model=IdxModel(), world_size=2)
    )
    assert isinstance(loader, DispatchingDataLoader) and loader.total_batch_size == 2 * loader.batch_size
    assert loader.positions is None  # each process's position differs: a resume replays
    every_process_reads = make_args(accelerator_config={"dispatch_batches": False})
    loader = build_train_dataloader(
        EpochIterable(),
        context_without_trainer(
            args=every_process_reads, data_collator=None, model=IdxModel(), world_size=2, process_index=1
        ),
    )
    assert type(loader.dataset).__name__ == "IterableDatasetShard" and loader.dataset.process_index == 1
    evaluation = build_eval_dataloader(
        EpochIterable(), context_without_trainer(args=make_args(), data_collator=None, model=IdxModel(), world_size=2)
    )
    assert isinstance(evaluation, DispatchingDataLoader) and evaluation.positions is None
    split = make_args(accelerator_config={"split_batches": True}, per_device_train_batch_size=3)
    with pytest.raises(ValueError, match="split_batches=True with a batch size of 3"):
        build_train_dataloader(
            EpochIterable(), context_without_trainer(args=split, data_collator=None, model=IdxModel(), world_size=2)
        )
    args = make_args(accelerator_config={"dispatch_batches": True})
    with pytest.raises(ValueError, match="dispatch_batches=True"):
        build_train_dataloader(
            idx_items(4), context_without_trainer(args=args, data_collator=None, model=IdxModel(), world_size=2)
        )


# ---- R3.8: DataLoader arguments and worker seeding ---------------------------------------------------------


def test_dataloader_arguments_match_reference(make_args):
    args = make_args(
        dataloader_num_workers=2,
        dataloader_prefetch_factor=3,
        dataloader_persistent_workers=True,
        dataloader_drop_last=True,
        dataloader_in_order=False,
        dataloader_multiprocessing_context="spawn",
        per_device_train_batch_size=3,
        per_device_eval_batch_size=5,
    )
    trainer = Trainer(model=IdxModel(), args=args, train_dataset=idx_items(10), eval_dataset=idx_items(10))
    names = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "in_order")
    pairs = [
        (build_train_dataloader(idx_items(10), context_without_trainer(args=args, data_collator=None, model=IdxModel())),
         trainer.get_train_dataloader()),
        (build_eval_dataloader(idx_items(10), context_without_trainer(args=args, data_collator=None, model=IdxModel())),
         trainer.get_eval_dataloader()),
    ]  # fmt: skip
    for ours, ref in pairs:
        for name in names:
            assert getattr(ours, name) == getattr(ref, name), name
        # The prepared reference loader keeps batch size and drop_last on its batch sampler.
        assert ours.batch_sampler.batch_size == ref.batch_sampler.batch_size
        assert ours.batch_sampler.drop_last == ref.batch_sampler.drop_last is True
        assert type(ours.multiprocessing_context) is type(ref.multiprocessing_context)
    train_init, ref_init = pairs[0][0].worker_init_fn, pairs[0][1].worker_init_fn
    assert train_init.func is seed_worker and train_init.keywords == ref_init.keywords
    assert pairs[1][0].worker_init_fn is None and pairs[1][1].worker_init_fn is None


class NumpyDraws(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> dict:
        worker = torch.utils.data.get_worker_info()
        return {"idx": index, "value": float(np.random.rand()), "worker": worker.id}


def test_workers_are_seeded_like_reference(make_args):
    args = make_args(
        seed=42,
        dataloader_num_workers=2,
        train_sampling_strategy="sequential",
        remove_unused_columns=False,
    )

    def run_ours() -> list[dict]:
        set_seed(42)
        loader = build_train_dataloader(
            NumpyDraws(), context_without_trainer(args=args, data_collator=None, model=IdxModel())
        )
        return [batch for batch in loader]

    first, second = run_ours(), run_ours()
    values = torch.cat([b["value"] for b in first])
    workers = torch.cat([b["worker"] for b in first])
    assert torch.equal(values, torch.cat([b["value"] for b in second]))  # reproducible
    assert set(workers.tolist()) == {0, 1}
    assert not torch.equal(values[workers == 0], values[workers == 1])  # workers differ

    trainer = Trainer(model=IdxModel(), args=args, train_dataset=NumpyDraws())
    ref_values = torch.cat([b["value"] for b in trainer.get_train_dataloader()])
    assert torch.equal(values, ref_values)


def test_seed_worker_matches_reference():
    from transformers.trainer_utils import seed_worker as ref_seed_worker

    draws = []
    for seed_fn in (seed_worker, ref_seed_worker):
        torch.manual_seed(1234)  # in a worker this is the DataLoader's base seed + worker id
        seed_fn(0, num_workers=3, rank=2)
        draws.append((torch.initial_seed(), np.random.rand(), random.random(), torch.rand(1).item()))
    assert draws[0] == draws[1]
    assert draws[0][0] == 3 * 2 + 1234


# ---- num_examples -------------------------------------------------------------------------------------------


class Unsized(torch.utils.data.Dataset):
    def __getitem__(self, index: int) -> dict:
        return {"idx": index}


def test_num_examples_matches_reference(make_args):
    args = make_args(per_device_train_batch_size=4)
    trainer = Trainer(model=IdxModel(), args=args)
    sized = DataLoader(idx_items(10), batch_size=3)
    unsized = DataLoader(Unsized(), batch_sampler=[[0, 1], [2, 3], [4]])
    for loader in (sized, unsized):
        assert num_examples(loader, 4) == trainer.num_examples(loader)
    assert num_examples(sized, 4) == 10 and num_examples(unsized, 4) == 12


def test_missing_dataset_raises(make_args):
    with pytest.raises(ValueError, match="requires a train_dataset"):
        build_train_dataloader(None, context_without_trainer(args=make_args(), data_collator=None, model=IdxModel()))
    with pytest.raises(ValueError, match="requires an eval_dataset"):
        build_eval_dataloader(None, context_without_trainer(args=make_args(), data_collator=None, model=IdxModel()))


def test_worker_init_is_picklable():
    import pickle

    init = functools.partial(seed_worker, num_workers=2, rank=1)
    assert pickle.loads(pickle.dumps(init)).keywords == {"num_workers": 2, "rank": 1}


TRANSFORMERS_FREE_SCRIPT = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("transformers", "accelerate", "datasets"):
            raise ImportError("blocked " + name)
sys.meta_path.insert(0, Block())
from types import SimpleNamespace
import torch
from hf_lightning.data.dataloaders import set_train_epoch
from tests.data.loader_builders import build_train_dataloader, context_without_trainer

class Plain(torch.nn.Module):
    def forward(self, x, labels=None):
        return {}

args = SimpleNamespace(
    remove_unused_columns=True, label_names=None, train_sampling_strategy="random", data_seed=None,
    accelerator_config=None, train_batch_size=2, gradient_accumulation_steps=1, dataloader_num_workers=0,
    dataloader_pin_memory=False, dataloader_persistent_workers=False, dataloader_multiprocessing_context=None,
    dataloader_prefetch_factor=None, dataloader_in_order=True, dataloader_drop_last=False,
    length_column_name="length", seed=42,
)
torch.manual_seed(42)
items = [{"x": float(i), "labels": i, "junk": "s"} for i in range(10)]
loader = build_train_dataloader(items, context_without_trainer(args=args, data_collator=None, model=Plain()))
for epoch in range(2):
    set_train_epoch(loader, epoch)
    batches = list(loader)
    print([i for batch in batches for i in batch["labels"].tolist()], sorted(batches[0]))
"""


def test_data_layer_runs_without_transformers():
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", TRANSFORMERS_FREE_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines == [f"{order} ['labels', 'x']" for order in SEED_42_ORDERS[:2]]


def test_an_iterable_dealt_from_the_first_process_under_tensor_parallel_replicas_is_refused(make_args):
    """4 processes as 2 tensor-parallel replicas: dealing from rank 0 would leave rank 1 (replica 0) reading too."""
    args = make_args()

    class FourProcesses:
        world_size = 4

        def __getattr__(self, name):
            return getattr(args, name)

    with pytest.raises(ValueError, match="tensor parallelism over 2 data-parallel replicas"):
        build_train_dataloader(
            EpochIterable(),
            context_without_trainer(args=FourProcesses(), data_collator=None, model=IdxModel(), world_size=2),
        )
    every_process_reads = make_args(accelerator_config={"dispatch_batches": False})
    FourProcesses.__getattr__ = lambda self, name: getattr(every_process_reads, name)
    loader = build_train_dataloader(
        EpochIterable(), context_without_trainer(args=FourProcesses(), data_collator=None, model=IdxModel(), world_size=2)
    )
    assert type(loader.dataset).__name__ == "IterableDatasetShard"
