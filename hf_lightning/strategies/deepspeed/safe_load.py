"""Refuse DeepSpeed engine checkpoints that could run code when loaded (docs/divergences.md).

DeepSpeed's `engine.load_checkpoint` unpickles `global_step*/*.pt` with `torch.load(weights_only=False)`, so
a crafted file runs code, and the reference loads them so. Before handing a checkpoint to the engine we
load each file with `weights_only=True`, allowing only the engine's own state classes below; a file that
needs anything else is refused, unless the user opts in for a checkpoint they trust.
"""

from __future__ import annotations

import glob
import importlib
import os
import pickle

import torch

TRUST_VARIABLE = "HF_LIGHTNING_TRUST_DEEPSPEED_CHECKPOINT"
# Plain state holders DeepSpeed pickles into its checkpoints (loss scalers, ZeRO stage, fragment addresses).
_ENGINE_STATE_CLASSES = (
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
)


def _engine_state_classes() -> list[type]:
    classes = []
    for dotted in _ENGINE_STATE_CLASSES:
        module_name, _, name = dotted.rpartition(".")
        try:
            classes.append(getattr(importlib.import_module(module_name), name))
        except (ImportError, AttributeError):
            continue  # another DeepSpeed version: that class cannot be in its checkpoints either
    return classes


def verify_engine_checkpoint(checkpoint: str) -> None:
    """Raise ValueError naming the file when a `global_step*/*.pt` file of `checkpoint` holds anything but
    tensors, plain containers and DeepSpeed's state classes (set HF_LIGHTNING_TRUST_DEEPSPEED_CHECKPOINT=1
    to load a checkpoint you trust anyway)."""
    if os.environ.get(TRUST_VARIABLE, "").lower() in ("1", "true", "yes"):
        return
    allowed = _engine_state_classes()
    for path in sorted(glob.glob(os.path.join(checkpoint, "global_step*", "*.pt"))):
        try:
            with torch.serialization.safe_globals(allowed):
                torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except (pickle.UnpicklingError, RuntimeError, AttributeError, TypeError) as error:
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ValueError(
                f"{path}: this DeepSpeed checkpoint file holds objects other than tensors and DeepSpeed's state "
                f"classes, and DeepSpeed would unpickle it with weights_only=False, which can run code "
                f"({first_line}). Load only checkpoints you trust: set {TRUST_VARIABLE}=1 to load this one anyway."
            ) from None
