"""Any checkpoint we write, sharded included, turned into a plain Hugging Face model folder (`from_pretrained`).

`hf-lightning consolidate CHECKPOINT [OUT]` and `consolidate_checkpoint()`: the checkpoint's whole weights are read
whichever strategy wrote them (strategies/portable_state.py; a sharded FSDP folder is merged by
`torch.distributed.checkpoint` without a process group) and written as `model.safetensors` (sharded with an index
when large) beside the checkpoint's config, generation config and processing-class files.
"""

from __future__ import annotations

import logging
import os
import shutil

from hf_lightning.checkpoint.output_folder import apply_umask
from hf_lightning.core.checkpoint_files import (
    COMPLETE_MARKER_NAME,
    SAFE_WEIGHTS_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
    TRAINING_ARGS_NAME,
)
from hf_lightning.data.position_files import DATA_POSITION_NAME
from hf_lightning.strategies.portable_state import read_full_model_state

logger = logging.getLogger(__name__)

# What a checkpoint holds for resuming (or as weights we rewrite), never copied into the model folder.
_STATE_FILES = frozenset(
    {COMPLETE_MARKER_NAME, SCHEDULER_NAME, SCALER_NAME, TRAINER_STATE_NAME, TRAINING_ARGS_NAME, DATA_POSITION_NAME}
)
_STATE_PREFIXES = (
    "optimizer", "rng_state", "pytorch_model", "model.safetensors", "model-0", "global_step", "hf_lightning_data_state",
)  # fmt: skip


def default_output_dir(checkpoint: str) -> str:
    """Where `consolidate` writes without OUT: `<checkpoint>-consolidated` beside the checkpoint."""
    return os.path.normpath(checkpoint) + "-consolidated"


def consolidate_checkpoint(checkpoint: str, output_dir: str | None = None) -> str:
    """Write `checkpoint`'s whole model (one process, DDP, FSDP full or sharded, tensor parallel) as a Hugging Face
    model folder `output_dir` (default `<checkpoint>-consolidated`) that `from_pretrained` loads; returns it."""
    checkpoint = os.fspath(checkpoint)
    if not os.path.isdir(checkpoint):
        raise ValueError(f"{checkpoint} is not a checkpoint folder")
    state = read_full_model_state(checkpoint)
    if state is None:
        raise ValueError(
            f"{checkpoint} holds no model weights we can read (model.safetensors, pytorch_model.bin, "
            "pytorch_model_fsdp.bin or a pytorch_model_fsdp_0/ folder); a DeepSpeed engine folder is consolidated "
            "with DeepSpeed's zero_to_fp32.py."
        )
    output_dir = os.fspath(output_dir) if output_dir is not None else default_output_dir(checkpoint)
    if os.path.abspath(output_dir) == os.path.abspath(checkpoint):
        raise ValueError("consolidate writes a new folder: give an OUT other than the checkpoint itself")
    os.makedirs(output_dir, exist_ok=True)
    _write_weights(state, output_dir)
    for name in sorted(os.listdir(checkpoint)):
        path = os.path.join(checkpoint, name)
        if os.path.isfile(path) and name not in _STATE_FILES and not name.startswith(_STATE_PREFIXES):
            shutil.copy2(path, os.path.join(output_dir, name))
    if not os.path.isfile(os.path.join(output_dir, "config.json")):
        logger.warning(
            f"{checkpoint} has no config.json: {output_dir} holds the weights only ({SAFE_WEIGHTS_NAME}); load "
            "them with model.load_state_dict(safetensors.torch.load_file(...))."
        )
    return output_dir


def _write_weights(state: dict, output_dir: str) -> None:
    """safetensors files as `save_pretrained` writes them: huggingface_hub's writer (shards, shared tensors) when
    installed, else one file with shared tensors copied apart."""
    try:
        from huggingface_hub import save_torch_state_dict
    except ImportError:
        import safetensors.torch

        seen: set[int] = set()
        plain = {}
        for key, tensor in state.items():
            pointer = tensor.untyped_storage().data_ptr()
            plain[key] = tensor.clone() if pointer in seen else tensor.contiguous()
            seen.add(pointer)
        safetensors.torch.save_file(plain, os.path.join(output_dir, SAFE_WEIGHTS_NAME), metadata={"format": "pt"})
    else:
        save_torch_state_dict(state, output_dir)
    apply_umask(output_dir)  # safetensors writes 0600; config.json beside it follows the umask
