"""Files the `hf-lightning` subcommands read and write: the `--ckpt_path` weights and the predictions.

Weights are read with core/checkpoint_files.py's `read_model_state_dict` (safetensors, or `torch.load(weights_only=True)`),
so a checkpoint never runs pickled code. Predictions go to `predictions.npz` (numpy arrays, no pickle).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

PREDICTIONS_NAME = "predictions.npz"
GENERATED_NAME = "generated_predictions.txt"
IGNORE_INDEX = -100


def resolve_checkpoint(ckpt_path: str, output_dir: str) -> str:
    """The folder `ckpt_path` names: a folder as is, `last` (newest complete checkpoint-N of output_dir) or `best`."""
    # lazy: the console script answers --help and `explain` before torch, Lightning or jsonargparse load
    from hf_lightning.checkpoint.files import get_last_checkpoint

    if ckpt_path in ("last", "best"):
        last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
        if last is None:
            raise ValueError(
                f"ckpt_path={ckpt_path!r}: no complete checkpoint-N folder in output_dir={output_dir!r}; run fit "
                "with a save_strategy other than 'no' first, or give the folder's path."
            )
        if ckpt_path == "last":
            return last
        with open(os.path.join(last, "trainer_state.json"), encoding="utf-8") as file:
            best = json.load(file).get("best_model_checkpoint")
        if best and not os.path.isdir(best):
            # Recorded relative to where fit ran: look for the same folder name in this output_dir.
            best = os.path.join(output_dir, os.path.basename(os.path.normpath(best)))
        if not best or not os.path.isdir(best):
            raise ValueError(
                f"ckpt_path='best': {last} records no best checkpoint ({best!r}); fit with metric_for_best_model "
                "set, or give ckpt_path='last' or a folder."
            )
        return best
    if not os.path.isdir(ckpt_path):
        raise ValueError(
            f"ckpt_path={ckpt_path!r} is not a folder; give a checkpoint-N folder written by fit (or fit's "
            "output_dir), 'last' or 'best'."
        )
    return ckpt_path


def checkpoint_progress(folder: str) -> tuple[float | None, int] | None:
    """The (epoch, global_step) a checkpoint's `trainer_state.json` records; None when the folder has none."""
    path = os.path.join(folder, "trainer_state.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as file:
        state = json.load(file)
    return state.get("epoch"), int(state.get("global_step") or 0)


def load_checkpoint_weights(model: Any, folder: str) -> None:
    """Load the model weights of `folder` into `model`; keys that do not fit raise ValueError.

    Missing keys are accepted only for weights tied to a loaded one (e.g. an LM head tied to the embeddings, which
    `save_pretrained` leaves out).
    """
    # lazy: the console script answers --help and `explain` before torch, Lightning or jsonargparse load
    from hf_lightning.core.checkpoint_files import read_model_state_dict

    state_dict = read_model_state_dict(folder)
    if state_dict is None:
        raise ValueError(
            f"ckpt_path={folder!r} holds no model weights (model.safetensors or pytorch_model.bin); give a "
            "checkpoint-N folder written by fit."
        )
    result = model.load_state_dict(state_dict, strict=False)
    tie_weights = getattr(model, "tie_weights", None)
    if result.missing_keys and callable(tie_weights):
        tie_weights()
    tensors = dict(model.state_dict(keep_vars=True))
    loaded_storage = {tensors[key].data_ptr() for key in state_dict if key in tensors}
    untied = [key for key in result.missing_keys if tensors[key].data_ptr() not in loaded_storage]
    if untied or result.unexpected_keys:
        raise ValueError(
            f"ckpt_path={folder!r} does not fit the configured model (missing: {untied[:5]}, unexpected: "
            f"{list(result.unexpected_keys)[:5]}); use the same model: section as the fit that wrote it."
        )


def write_predictions(output: Any, output_dir: str, processing_class: Any = None) -> list[str]:
    """Write `predictions.npz` (and, given a tokenizer, the decoded `generated_predictions.txt`); returns the paths.

    In the `.npz`: `predictions` and, when the data has labels, `label_ids`; a tuple of arrays is stored as
    `predictions_0`, `predictions_1`, ... (nested tuples as `predictions_0_1`). Load with `numpy.load(path)`.
    """
    os.makedirs(output_dir, exist_ok=True)
    arrays = _flatten("predictions", output.predictions)
    if output.label_ids is not None:
        arrays.update(_flatten("label_ids", output.label_ids))
    path = os.path.join(output_dir, PREDICTIONS_NAME)
    np.savez(path, **arrays)
    written = [path]
    if processing_class is not None and callable(getattr(processing_class, "decode", None)):
        predictions = output.predictions[0] if isinstance(output.predictions, tuple) else output.predictions
        pad_token_id = getattr(processing_class, "pad_token_id", None) or 0
        lines = [_decode(processing_class, row, pad_token_id) for row in np.asarray(predictions)]
        text_path = os.path.join(output_dir, GENERATED_NAME)
        with open(text_path, "w", encoding="utf-8") as file:
            file.write("".join(line + "\n" for line in lines))
        written.append(text_path)
    return written


def _flatten(name: str, value: Any) -> dict[str, np.ndarray]:
    if isinstance(value, (tuple, list)):
        arrays: dict[str, np.ndarray] = {}
        for index, item in enumerate(value):
            arrays.update(_flatten(f"{name}_{index}", item))
        return arrays
    return {name: np.asarray(value)}


def _decode(processing_class: Any, row: Sequence[int], pad_token_id: int) -> str:
    ids = [pad_token_id if int(token) == IGNORE_INDEX else int(token) for token in row]
    return processing_class.decode(ids, skip_special_tokens=True).replace("\n", " ").strip()
