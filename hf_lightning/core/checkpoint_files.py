"""The reference's checkpoint file names, and torch files read without running pickled code.

The bottom of the checkpoint stack: the strategies' checkpoint I/O and `checkpoint/` (layout, completeness,
rotation, resume) both name files and read them through here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Any

PREFIX_CHECKPOINT_DIR = "checkpoint"
CHECKPOINT_DIR_PATTERN = re.compile(r"^" + PREFIX_CHECKPOINT_DIR + r"\-(\d+)$")
SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
WEIGHTS_NAME = "pytorch_model.bin"
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"
ADAPTER_SAFE_WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_WEIGHTS_NAME = "adapter_model.bin"
OPTIMIZER_NAME = "optimizer.pt"
SCHEDULER_NAME = "scheduler.pt"
SCALER_NAME = "scaler.pt"
TRAINER_STATE_NAME = "trainer_state.json"
TRAINING_ARGS_NAME = "training_args.bin"
COMPLETE_MARKER_NAME = "hf_lightning_complete.json"


def checkpoint_folder_name(global_step: int) -> str:
    return f"{PREFIX_CHECKPOINT_DIR}-{global_step}"


def rng_state_file_name(world_size: int, process_index: int) -> str:
    """`rng_state.pth` for one process, `rng_state_{rank}.pth` for each process of a distributed run."""
    return "rng_state.pth" if world_size <= 1 else f"rng_state_{process_index}.pth"


def safe_torch_load(
    file_path: str, *, numpy_allowed: bool = False, map_location: Any = "cpu", mmap: bool = False
) -> Any:
    """`torch.load(weights_only=True)`: tensors and plain containers only, so no pickled code ever runs.

    A file holding any other pickled object (code that would run when unpickled) raises ValueError naming the
    file; so does a file torch cannot read at all. `numpy_allowed` admits numpy's RNG state (the reference's
    allowlist for `rng_state.pth`).
    """
    import pickle

    import torch

    context = numpy_safe_globals() if numpy_allowed else contextlib.nullcontext()
    try:
        with context:
            # mmap needs torch's zip format (files start with "PK"); others go through the plain reader.
            mmap = mmap and _starts_with(file_path, b"PK")
            return torch.load(file_path, map_location=map_location, weights_only=True, mmap=mmap or None)
    except pickle.UnpicklingError as error:
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise ValueError(
            f"Refusing to load {file_path}: it holds pickled objects other than tensors and plain containers, "
            f"which could run code when unpickled ({reason}). hf_lightning only loads checkpoint files with "
            "torch.load(weights_only=True); re-create the file from a state dict with torch.save, or remove it."
        ) from error
    except Exception as error:  # torch's unpickler fails with many types on garbage (IndexError, KeyError, ...)
        raise ValueError(
            f"Cannot read {file_path} ({type(error).__name__}: {error}); the checkpoint is damaged."
        ) from error


def _starts_with(file_path: str, prefix: bytes) -> bool:
    with open(file_path, "rb") as f:
        return f.read(len(prefix)) == prefix


def numpy_safe_globals() -> Any:
    """Allow numpy's RNG state in `torch.load(weights_only=True)`: the reference's allowlist, nothing more."""
    import numpy as np
    import torch

    np_core = np._core if hasattr(np, "_core") else np.core
    allowlist = [np_core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    return torch.serialization.safe_globals(allowlist)


def read_model_state_dict(checkpoint_dir: str) -> dict | None:
    """The model weights saved in `checkpoint_dir`, on CPU and without unpickling code; None when it holds none."""
    import safetensors.torch

    safe_path = os.path.join(checkpoint_dir, SAFE_WEIGHTS_NAME)
    if os.path.isfile(safe_path):
        return safetensors.torch.load_file(safe_path, device="cpu")
    for index_name, safe in ((SAFE_WEIGHTS_INDEX_NAME, True), (WEIGHTS_INDEX_NAME, False)):
        index_path = os.path.join(checkpoint_dir, index_name)
        if os.path.isfile(index_path):
            with open(index_path, encoding="utf-8") as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
            state_dict: dict = {}
            for shard in shards:
                shard_path = os.path.join(checkpoint_dir, shard)
                if safe:
                    state_dict.update(safetensors.torch.load_file(shard_path, device="cpu"))
                else:
                    state_dict.update(safe_torch_load(shard_path))
            return state_dict
    bin_path = os.path.join(checkpoint_dir, WEIGHTS_NAME)
    if os.path.isfile(bin_path):
        return safe_torch_load(bin_path)
    return None
