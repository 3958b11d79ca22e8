"""The evaluation helpers against the reference's own (transformers' trainer_pt_utils / trainer_utils)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from transformers import trainer_pt_utils as ref_pt
from transformers import trainer_utils as ref_utils

import hf_lightning.evaluation.helpers as eval_utils
from hf_lightning.data.sized import has_length


def _assert_same(ours, ref):
    """Same nesting, types, dtypes, shapes and values (NaN equal to NaN)."""
    assert type(ours) is type(ref), (type(ours), type(ref))
    if isinstance(ref, (list, tuple)):
        assert len(ours) == len(ref)
        for o, r in zip(ours, ref):
            _assert_same(o, r)
    elif isinstance(ref, dict):
        assert list(ours) == list(ref)
        for key in ref:
            _assert_same(ours[key], ref[key])
    elif isinstance(ref, torch.Tensor):
        assert ours.dtype == ref.dtype and ours.shape == ref.shape
        assert torch.equal(ours, ref) or torch.allclose(ours, ref, equal_nan=True)
    elif isinstance(ref, np.ndarray):
        assert ours.dtype == ref.dtype and ours.shape == ref.shape
        np.testing.assert_array_equal(ours, ref)
    else:
        assert ours == ref


def _t(*shape, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(*shape, generator=generator).to(dtype)
    return torch.randint(0, 9, shape, generator=generator).to(dtype)


CONCAT_CASES = {
    "same width": (_t(2, 5), _t(3, 5, seed=1)),
    "wider second": (_t(2, 5, 3), _t(1, 7, 3, seed=1)),
    "narrower second": (_t(2, 7), _t(2, 4, seed=1)),
    "1-d": (_t(2), _t(3, seed=1)),
    "0-d promoted": (torch.tensor(1.5), torch.tensor(2.5)),
    "int labels": (_t(2, 3, dtype=torch.long), _t(2, 6, dtype=torch.long, seed=1)),
    "bf16": (_t(2, 3, dtype=torch.bfloat16), _t(2, 4, dtype=torch.bfloat16, seed=1)),
    "tuple": ((_t(2, 5), _t(2)), (_t(1, 6, seed=1), _t(1, seed=1))),
    "list": ([_t(2, 3)], [_t(2, 2, seed=1)]),
    "dict": ({"a": _t(2, 3), "b": _t(2, 4, 2)}, {"a": _t(1, 5, seed=1), "b": _t(1, 4, 2, seed=1)}),
    "nested": (({"a": (_t(2, 3),)},), ({"a": (_t(2, 1, seed=1),)},)),
}


@pytest.mark.parametrize("name", list(CONCAT_CASES))
@pytest.mark.parametrize("as_numpy", [False, True])
@pytest.mark.parametrize("padding_index", [-100, 0])
def test_nested_concat_matches_reference(name, as_numpy, padding_index):
    first, second = CONCAT_CASES[name]
    if as_numpy:
        if name == "bf16":
            first, second = ref_pt.nested_numpify(first), ref_pt.nested_numpify(second)
        else:
            first, second = eval_utils.nested_numpify(first), eval_utils.nested_numpify(second)
    expected = ref_pt.nested_concat(first, second, padding_index=padding_index)
    _assert_same(eval_utils.nested_concat(first, second, padding_index=padding_index), expected)


def test_pad_and_concatenate_functions_match_reference():
    a, b = _t(2, 3, 4), _t(3, 6, 4, seed=1)
    _assert_same(eval_utils.torch_pad_and_concatenate(a, b), ref_pt.torch_pad_and_concatenate(a, b))
    _assert_same(
        eval_utils.numpy_pad_and_concatenate(a.numpy(), b.numpy(), padding_index=7),
        ref_pt.numpy_pad_and_concatenate(a.numpy(), b.numpy(), padding_index=7),
    )
    # The padded region really is -100 (what predict() promises users).
    result = eval_utils.torch_pad_and_concatenate(a, b)
    assert result.shape == (5, 6, 4)
    assert (result[:2, 3:] == -100).all() and torch.equal(result[2:], b)


def test_nested_concat_rejects_mismatched_types():
    with pytest.raises(TypeError, match="same type"):
        eval_utils.nested_concat((_t(1, 2),), [_t(1, 2)])
    with pytest.raises(TypeError, match="Unsupported type"):
        eval_utils.nested_concat("a", "b")


@pytest.mark.parametrize(
    "value",
    [
        _t(3, 2),
        {"input_ids": _t(4, 2), "labels": _t(4)},
        ({"x": torch.tensor(1.0)}, [np.zeros((5, 2))]),
        [torch.tensor(2.0)],
        {"meta": "text", "x": _t(6)},
        "text",
        {},
    ],
)
def test_find_batch_size_matches_reference(value):
    assert eval_utils.find_batch_size(value) == ref_pt.find_batch_size(value)


@pytest.mark.parametrize(
    "value",
    [
        _t(2, 3, dtype=torch.bfloat16),
        (_t(2, 3), {"a": _t(1, dtype=torch.long)}),
        [_t(2, 3, dtype=torch.float16)],
    ],
)
def test_nested_numpify_and_detach_match_reference(value):
    _assert_same(eval_utils.nested_numpify(value), ref_pt.nested_numpify(value))
    with_grad = _t(2, 2).requires_grad_()
    nested = {"a": (with_grad * 2, "keep"), "b": [with_grad]}
    ours, ref = eval_utils.nested_detach(nested), ref_pt.nested_detach(nested)
    _assert_same(ours, ref)
    assert not ours["a"][0].requires_grad and ours["a"][1] == "keep"


@pytest.mark.parametrize("do_concat", [True, False])
@pytest.mark.parametrize("move_every", [None, 1, 2])
def test_eval_loop_container_matches_reference(do_concat, move_every):
    batches = [(_t(2, 5, 3, seed=i), _t(2, 5 + i, dtype=torch.long, seed=i)) for i in range(4)] + [
        (_t(1, 2, 3, seed=9), _t(1, 2, dtype=torch.long, seed=9))
    ]
    ours, ref = eval_utils.EvalLoopContainer(do_concat), ref_pt.EvalLoopContainer(do_concat)
    for step, batch in enumerate(batches):
        ours.add(batch)
        ref.add(batch)
        if move_every is not None and (step + 1) % move_every == 0:
            ours.to_cpu_and_numpy()
            ref.to_cpu_and_numpy()
    _assert_same(ours.get_arrays(), ref.get_arrays())
    assert eval_utils.EvalLoopContainer().get_arrays() is None


@pytest.mark.parametrize(
    "metrics",
    [
        {"a": np.float32(0.5), "b": torch.tensor([3]), "c": torch.tensor([1.0, 2.0]), "d": "x"},
        {"nested": [np.int64(2), (torch.tensor(1.5), 3)]},
        [np.bool_(True)],
    ],
)
def test_denumpify_detensorize_matches_reference(metrics):
    ours, ref = eval_utils.denumpify_detensorize(metrics), ref_utils.denumpify_detensorize(metrics)
    _assert_same(ours, ref)


def test_speed_metrics_matches_reference(monkeypatch):
    for runtime in (2.123456, 0.0):
        monkeypatch.setattr(time, "time", lambda r=runtime: 100.0 + r)
        for kwargs in ({}, {"num_samples": 5, "num_steps": 3}, {"num_tokens": 7}):
            ours = eval_utils.speed_metrics("eval", 100.0, **kwargs)
            assert ours == ref_utils.speed_metrics("eval", 100.0, **kwargs)
    monkeypatch.setattr(time, "time", lambda: 102.0)
    assert eval_utils.speed_metrics("test", 100.0, num_samples=5, num_steps=3) == {
        "test_runtime": 2.0,
        "test_samples_per_second": 2.5,
        "test_steps_per_second": 1.5,
    }


class _Unsized(torch.utils.data.IterableDataset):
    def __init__(self, n: int = 3):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


@pytest.mark.parametrize("value", [[1, 2], _Unsized(), torch.zeros(3), 5])
def test_has_length_matches_reference(value):
    assert has_length(value) == ref_utils.has_length(value)


def test_iterate_with_last_flag():
    assert list(eval_utils.iterate_with_last_flag([])) == []
    assert list(eval_utils.iterate_with_last_flag("ab")) == [("a", False), ("b", True)]
    assert list(eval_utils.iterate_with_last_flag(iter([7]))) == [(7, True)]


def _accelerate_remainder(dataloader):
    """What accelerate computes for a prepared dataloader (the reference's gather relies on it)."""
    from accelerate import Accelerator

    prepared = Accelerator(cpu=True).prepare_data_loader(dataloader)
    for _ in prepared:
        remainder = prepared.remainder
    return remainder


@pytest.mark.parametrize(
    "loader_kwargs",
    [
        {"dataset": list(range(5)), "batch_size": 2},
        {"dataset": list(range(6)), "batch_size": 2},
        {"dataset": list(range(5)), "batch_size": 2, "drop_last": True},
        {"dataset": _Unsized(5), "batch_size": 2},
        {"dataset": _Unsized(6), "batch_size": 2},
        {"dataset": _Unsized(5), "batch_size": 2, "drop_last": True},
    ],
)
def test_last_batch_remainder_matches_accelerate(loader_kwargs):
    dataloader = torch.utils.data.DataLoader(**loader_kwargs)
    *_, last_batch = dataloader
    assert eval_utils.last_batch_remainder(dataloader, last_batch) == _accelerate_remainder(dataloader)


def test_drop_last_batch_padding():
    losses = torch.tensor([1.0, 1.0])
    assert torch.equal(eval_utils.drop_last_batch_padding(losses, True, 1), torch.tensor([1.0]))
    assert eval_utils.drop_last_batch_padding(losses, False, 1) is losses
    assert eval_utils.drop_last_batch_padding(losses, True, 0) is losses
    assert eval_utils.drop_last_batch_padding(losses, True, -1) is losses
    nested = eval_utils.drop_last_batch_padding({"a": (torch.zeros(3, 2),)}, True, 2)
    assert nested["a"][0].shape == (2, 2)
    assert eval_utils.drop_last_batch_padding(["a", "b", "c"], True, 2) == ["a", "b"]


def test_metric_driven_schedulers_are_recognised():
    from transformers.optimization import GreedyLR as ReferenceGreedyLR

    from hf_lightning.optim.schedulers import GreedyLR

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    assert eval_utils.is_metric_driven_scheduler(torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer))
    assert eval_utils.is_metric_driven_scheduler(GreedyLR(optimizer))
    assert eval_utils.is_metric_driven_scheduler(ReferenceGreedyLR(optimizer))
    assert not eval_utils.is_metric_driven_scheduler(
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    )
    assert not eval_utils.is_metric_driven_scheduler(None)


def test_spans_several_devices():
    model = torch.nn.Linear(2, 2)
    assert not eval_utils.spans_several_devices(model)
    model.hf_device_map = {"a": 0, "b": 0}
    assert not eval_utils.spans_several_devices(model)
    model.hf_device_map = {"a": 0, "b": 1}
    assert eval_utils.spans_several_devices(model)


def test_remainder_of_iterable_loaders_across_processes():
    """Each process's shard: 0 when sized (nothing cut, as accelerate's `begin()`), -1 unsized; a loader dealt
    from the first process: unknown (-1) until its last batch (tests/data/test_iterable_across_processes.py)."""
    from torch.utils.data import IterableDataset

    from hf_lightning.data.dataloaders import DispatchingDataLoader, HFDataLoader
    from hf_lightning.data.iterable_sharding import IterableDatasetShard

    class Stream(IterableDataset):
        def __iter__(self):
            yield from (torch.tensor([i]) for i in range(5))

    class SizedStream(Stream):
        def __len__(self):
            return 5

    batch = torch.zeros(2, 1)
    sized = HFDataLoader(IterableDatasetShard(SizedStream(), batch_size=2, num_processes=2), batch_size=2)
    unsized = HFDataLoader(IterableDatasetShard(Stream(), batch_size=2, num_processes=2), batch_size=2)
    assert eval_utils.last_batch_remainder(sized, batch, 2) == 0
    assert eval_utils.last_batch_remainder(unsized, batch, 2) == -1
    dealt = DispatchingDataLoader(SizedStream(), batch_size=2, num_processes=2, process_index=0, split_batches=False)
    assert eval_utils.last_batch_remainder(dealt, batch, 2) == -1
    dealt.remainder = 3  # what its iteration sets at the last batch
    assert eval_utils.last_batch_remainder(dealt, batch, 2) == 3
