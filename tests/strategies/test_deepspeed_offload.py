"""With optimizer offload, a torch optimizer becomes DeepSpeed's CPU optimizer (accelerate's mapping)."""

from __future__ import annotations

import deepspeed.ops.adagrad
import deepspeed.ops.adam
import torch

from hf_lightning.strategies.deepspeed.strategy import _offload_ready_optimizer

OFFLOAD = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}


class Recorder:
    """Stands in for a DeepSpeed CPU optimizer (building the real one compiles a C++ op)."""

    def __init__(self, params, **kwargs):
        self.params, self.kwargs = params, kwargs


def _optimizer(kind):
    return kind([torch.nn.Parameter(torch.zeros(2))], lr=0.1, weight_decay=0.01)


def test_adagrad_maps_to_cpu_adagrad_without_adam_only_arguments(monkeypatch):
    # accelerate passes adamw_mode to DeepSpeedCPUAdagrad too, whose constructor has no such argument.
    monkeypatch.setattr(deepspeed.ops.adagrad, "DeepSpeedCPUAdagrad", Recorder)
    mapped = _offload_ready_optimizer(_optimizer(torch.optim.Adagrad), OFFLOAD)
    assert isinstance(mapped, Recorder) and mapped.kwargs == {"lr": 0.1, "weight_decay": 0.01}


def test_adamw_and_adam_map_to_cpu_adam_in_their_modes(monkeypatch):
    monkeypatch.setattr(deepspeed.ops.adam, "DeepSpeedCPUAdam", Recorder)
    assert _offload_ready_optimizer(_optimizer(torch.optim.AdamW), OFFLOAD).kwargs["adamw_mode"] is True
    assert _offload_ready_optimizer(_optimizer(torch.optim.Adam), OFFLOAD).kwargs["adamw_mode"] is False


def test_without_offload_the_optimizer_is_kept():
    optimizer = _optimizer(torch.optim.AdamW)
    assert _offload_ready_optimizer(optimizer, {"zero_optimization": {"stage": 2}}) is optimizer
