"""Out-of-memory recognition (core/devices.py), against accelerate's own rule."""

from __future__ import annotations

import pytest

from hf_lightning.core.devices import is_out_of_memory


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"),
        RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"),
        RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if ..."),
        RuntimeError("CUDA out of memory.", "second argument"),
        RuntimeError("shape mismatch"),
        ValueError("CUDA out of memory."),
    ],
)
def test_is_out_of_memory_matches_accelerate(error):
    from accelerate.utils.memory import should_reduce_batch_size

    assert is_out_of_memory(error) == should_reduce_batch_size(error)
