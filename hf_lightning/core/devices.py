"""Device memory: emptying the allocator's cache, and recognising the errors that mean "out of memory".

One place for both, used by the training run (`auto_find_batch_size` retries, `torch_empty_cache_steps`),
the evaluation loop and hyperparameter-search trials.
"""

from __future__ import annotations

import gc

import torch

__all__ = ["empty_device_cache", "is_out_of_memory"]

# accelerate's `should_reduce_batch_size` list: the messages of the errors a smaller batch may avoid.
_OUT_OF_MEMORY_MESSAGES = (
    " out of memory.",  # CUDA, HIP, XPU
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",  # HPU
)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is an out-of-memory error that a smaller batch may avoid (accelerate's rule)."""
    if isinstance(error, RuntimeError) and len(error.args) == 1:
        return any(message in str(error.args[0]) for message in _OUT_OF_MEMORY_MESSAGES)
    return False


def empty_device_cache(collect_garbage: bool = False) -> None:
    """Release the accelerator's cached memory (CUDA, else MPS); first collect garbage when asked."""
    if collect_garbage:
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    elif hasattr(torch, "mps") and torch.backends.mps.is_available():
        torch.mps.empty_cache()
