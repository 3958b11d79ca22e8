"""Autocast around the model's forward only, with float32 outputs: how accelerate runs a prepared model in mixed
precision, so the loss code outside the forward runs without autocast. Training and evaluation both use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def planned_autocast_dtype(settings: Any) -> torch.dtype | None:
    """The dtype the plan's module settings autocast the forward to: bf16, fp16 (never on CPU, where accelerate
    turns it off), or None for full precision."""
    return _AUTOCAST_DTYPES.get(settings.forward_autocast)


def convert_outputs_to_fp32(outputs: Any) -> Any:
    """Cast the float16 / bfloat16 tensors of a (nested) model output to float32."""
    if isinstance(outputs, torch.Tensor):
        return outputs.float() if outputs.dtype in (torch.float16, torch.bfloat16) else outputs
    if isinstance(outputs, tuple) and hasattr(outputs, "_fields"):
        return type(outputs)(*(convert_outputs_to_fp32(item) for item in outputs))
    if isinstance(outputs, (list, tuple)):
        return type(outputs)(convert_outputs_to_fp32(item) for item in outputs)
    if isinstance(outputs, Mapping):
        converted = {key: convert_outputs_to_fp32(value) for key, value in outputs.items()}
        try:
            return type(outputs)(converted)
        except TypeError:
            return converted
    return outputs


@contextlib.contextmanager
def autocast_forward(model: torch.nn.Module, device_type: str, dtype: torch.dtype | None) -> Iterator[None]:
    """Run `model`'s forward under `torch.autocast(device_type, dtype)` and return float32 outputs, while inside.

    accelerate wraps a prepared model's forward this way when `fp16` / `bf16` mixed precision is on, so the
    reference evaluates in mixed precision and returns float32 logits; the loss code outside the forward runs
    without autocast. `dtype=None` does nothing.
    """
    if dtype is None:
        yield
        return
    contexts: list[Any] = []

    def enter(module: torch.nn.Module, args: Any) -> None:
        context = torch.autocast(device_type=device_type, dtype=dtype)
        context.__enter__()
        contexts.append(context)

    def leave(module: torch.nn.Module, args: Any, output: Any) -> Any:
        # `always_call=True` runs this even when the forward raises, so autocast never leaks.
        contexts.pop().__exit__(None, None, None)
        return convert_outputs_to_fp32(output)

    pre_handle = model.register_forward_pre_hook(enter)
    post_handle = model.register_forward_hook(leave, always_call=True)
    try:
        yield
    finally:
        pre_handle.remove()
        post_handle.remove()


