"""The forward-only autocast (core/autocast.py): low precision inside the forward, float32 out, nothing leaked."""

from __future__ import annotations

import pytest
import torch

from hf_lightning.core.autocast import autocast_forward


def test_autocast_forward_runs_in_low_precision_and_returns_float32():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with autocast_forward(model, "cpu", torch.bfloat16):
        inside = model(x)
    expected = torch.nn.functional.linear(
        x.bfloat16(), model.weight.bfloat16(), model.bias.bfloat16()
    ).float()
    assert inside.dtype == torch.float32
    torch.testing.assert_close(inside, expected)
    # Hooks are removed on exit and after an error in the forward; autocast does not leak.
    assert model(x).dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
    with pytest.raises(RuntimeError), autocast_forward(model, "cpu", torch.bfloat16):
        model(torch.randn(2, 5))
    assert not torch.is_autocast_enabled("cpu")
    assert not model._forward_hooks and not model._forward_pre_hooks
