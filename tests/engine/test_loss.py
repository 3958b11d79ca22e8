"""Loss helpers against the reference (R4.2, R4.3, R4.9)."""

from __future__ import annotations

import torch

from hf_lightning.engine.loss import LabelSmoother, count_items_in_window, neftune_post_forward_hook


def test_label_smoother_matches_reference():
    from transformers.trainer_pt_utils import LabelSmoother as ReferenceSmoother

    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    labels = torch.randint(0, 7, (2, 5))
    labels[0, :2] = -100
    for shift in (False, True):
        for count in (None, torch.tensor(6.0)):
            ours = LabelSmoother(0.1)({"logits": logits}, labels, shift_labels=shift, num_items_in_batch=count)
            ref = ReferenceSmoother(0.1)({"logits": logits}, labels, shift_labels=shift, num_items_in_batch=count)
            torch.testing.assert_close(ours, ref)


def test_label_smoother_equals_cross_entropy_sum_over_count():
    torch.manual_seed(1)
    logits = torch.randn(4, 3)
    labels = torch.tensor([0, 2, 1, 1])
    expected = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.1, reduction="sum") / 4
    torch.testing.assert_close(LabelSmoother(0.1)({"logits": logits}, labels, num_items_in_batch=4), expected)


def test_count_items_in_window_shifts_for_causal_lm():
    labels_a = torch.tensor([[-100, 1, 2, -100], [3, 4, 5, 6]])
    labels_b = torch.tensor([[-100, -100, 7, 8]])
    window = [{"labels": labels_a}, {"labels": labels_b}]
    assert count_items_in_window(window, shifts_labels=False).item() == 8
    assert count_items_in_window(window, shifts_labels=True).item() == 7
    assert count_items_in_window([{"labels": [1, 2]}], shifts_labels=False) is None
    assert count_items_in_window([{"labels": labels_a, "shift_labels": labels_b}], True).item() == 2


def test_neftune_noise_bounds_and_eval_mode():
    embedding = torch.nn.Embedding(10, 8)
    embedding.neftune_noise_alpha = 5.0
    output = torch.zeros(3, 4, 8)
    noisy = neftune_post_forward_hook(embedding, None, output)
    assert noisy.abs().max() <= 5.0 / (4 * 8) ** 0.5 + 1e-6
    assert noisy.abs().max() > 0
    embedding.eval()
    assert torch.equal(neftune_post_forward_hook(embedding, None, output), output)
