"""The Python, NumPy and torch CPU random states of one process, as tensors and plain numbers.

A collator that masks at random draws from these generators while a batch is fetched: in the main process before
the model's forward passes of the batch before it (the loader draws one batch ahead), or in a worker process. A
checkpoint's own RNG file holds the main process's state at the step boundary, after that fetch, so a resume that
must fetch the batch again needs the state from just before it (and each worker's state). They are kept as tensors
(safetensors in the checkpoint, `data/position_files.py`) and numbers (JSON), never pickled objects.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def process_random_state() -> dict[str, Any]:
    """This process's Python, NumPy (legacy global) and torch CPU generator states."""
    version, internal, gauss = random.getstate()
    kind, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "kind": kind,
            "key": torch.from_numpy(key.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }


def set_process_random_state(state: dict[str, Any]) -> None:
    """Put this process's generators where `process_random_state` found them."""
    python = state["python"]
    random.setstate((python["version"], tuple(int(value) for value in python["internal"].tolist()), python["gauss"]))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["kind"],
            numpy_state["key"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
