"""The lazily filtered training loss equals the reference's per-micro-batch NaN/Inf rule bit for bit."""

from __future__ import annotations

import math
import random

import pytest
import torch

import hf_lightning.engine.loss_window as loss_window
from hf_lightning.engine.loss_window import TrainLossWindow


def reference_tr_loss(
    start: float, terms: list[tuple[float, int]], filter_non_finite: bool, dtype=torch.float32
) -> torch.Tensor:
    """transformers' `_inner_training_loop` update of `self._tr_loss` (float32, in place), one micro-batch at a
    time; each loss has `dtype`."""
    tr_loss = torch.tensor(start)
    for value, steps_since_log in terms:
        tr_loss_step = torch.tensor(value, dtype=dtype)
        if filter_non_finite and (torch.isnan(tr_loss_step) or torch.isinf(tr_loss_step)):
            tr_loss += tr_loss / steps_since_log
        else:
            tr_loss += tr_loss_step
    return tr_loss


def random_terms(seed: int, count: int, non_finite_share: float) -> list[tuple[float, int]]:
    rng = random.Random(seed)
    terms = []
    for index in range(count):
        value = rng.uniform(0.01, 7.0)
        if rng.random() < non_finite_share:
            value = rng.choice([math.nan, math.inf, -math.inf])
        terms.append((value, 1 + index // 3))  # the step count grows every third micro-batch (GA 3)
    return terms


def window_total(start: float, terms, filter_non_finite: bool, dtype=torch.float32) -> torch.Tensor:
    window = TrainLossWindow("cpu")
    window.total += start
    for value, steps_since_log in terms:
        window.add(torch.tensor(value, dtype=dtype), steps_since_log, filter_non_finite)
    return window.settle()


def same_bits(ours: torch.Tensor, reference: torch.Tensor) -> bool:
    return ours.dtype == reference.dtype and (
        (math.isnan(ours.item()) and math.isnan(reference.item())) or ours.item() == reference.item()
    )


@pytest.mark.parametrize("non_finite_share", [0.0, 0.05, 0.5])
@pytest.mark.parametrize("seed", range(4))
def test_settled_total_is_the_reference_tr_loss(seed, non_finite_share):
    terms = random_terms(seed, 200, non_finite_share)
    for filter_non_finite in (True, False):
        ours = window_total(0.25, terms, filter_non_finite)
        assert same_bits(ours, reference_tr_loss(0.25, terms, filter_non_finite))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_losses_of_other_dtypes_sum_into_float32_as_the_reference(dtype):
    """A model in double or half precision returns such losses; the reference's float32 `tr_loss` rounds at each
    in-place add, which the replay must do too."""
    terms = random_terms(11, 300, 0.05)
    for filter_non_finite in (True, False):
        ours = window_total(0.1, terms, filter_non_finite, dtype)
        assert same_bits(ours, reference_tr_loss(0.1, terms, filter_non_finite, dtype))


def test_a_finite_overflowing_sum_is_replayed_to_the_reference_value():
    terms = [(3e38, 1), (3e38, 1), (-3e38, 2)]  # inf after two finite terms; the reference keeps inf
    assert same_bits(window_total(0.0, terms, True), reference_tr_loss(0.0, terms, True))


def test_windows_are_independent_after_reset():
    window = TrainLossWindow("cpu")
    first, second = random_terms(1, 30, 0.2), random_terms(2, 30, 0.2)
    for value, steps in first:
        window.add(torch.tensor(value), steps, True)
    assert same_bits(window.settle(), reference_tr_loss(0.0, first, True))
    window.reset()
    for value, steps in second:
        window.add(torch.tensor(value), steps, True)
    assert same_bits(window.settle(), reference_tr_loss(0.0, second, True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_long_window_is_folded_on_the_device_with_the_same_result(monkeypatch, dtype):
    monkeypatch.setattr(loss_window, "_MAX_KEPT_TERMS", 16)
    terms = random_terms(7, 100, 0.1)
    window = TrainLossWindow("cpu")
    for value, steps in terms:
        window.add(torch.tensor(value, dtype=dtype), steps, True)
        assert len(window._terms) < 16  # bounded memory
    assert same_bits(window.settle(), reference_tr_loss(0.0, terms, True, dtype))


def test_add_reads_nothing_from_the_device(monkeypatch):
    """Between logs the window never converts a tensor to a Python value (a GPU would wait for it)."""
    window = TrainLossWindow("cpu")

    def refuse(*args, **kwargs):
        raise AssertionError("host read during add()")

    for name in ("item", "__bool__", "__float__", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    for value, steps in random_terms(3, 50, 0.2):
        window.add(torch.tensor(value), steps, True)
