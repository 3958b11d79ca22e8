"""The data position a checkpoint keeps, on disk: one JSON file for the run, one safetensors file per process.

`hf_lightning_data_position.json` (written by the process that saves) says where the train data stands at the
checkpoint's step, in terms any number of processes can read:

    {"format": 1, "global_step": 12, "epoch": 1, "batch": 4, "end_of_epoch": false,
     "batch_size": 2, "num_processes": 1, "samples_in_epoch": 8, "num_workers": 2,
     "kind": "iterable", "restore": "dataset_state", "dataset": "IterableDataset"}

`epoch` is the pass over the data, `batch` the batches of one process trained on in it, `samples_in_epoch` the
examples all processes took from it (`batch x batch_size x num_processes`: what resharding onto another number of
processes re-deals). `restore` says how a resume puts the data back: `sampler` (a map-style dataset: the sampler
skips the indices, nothing else is needed), `dataset_state` (the dataset's own `state_dict()`), `examples_drawn`
(the examples each reader drew, drawn again without collating), `replay` (nothing recorded: the batches are
replayed as the reference does).

`hf_lightning_data_state.safetensors` (`..._<process>.safetensors` when several processes train) holds this
process's train-loader state (torchdata's `StatefulDataLoader.state_dict()`: the sampler's and each worker's
position, the dataset states, the random states a random collator draws from) as JSON in the safetensors metadata,
with every tensor in it (the random states) stored as a tensor. Nothing is pickled: both files are read without
running code, and each is part of the checkpoint's completeness check (`checkpoint/files.py`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from hf_lightning.core.file_modes import give_ordinary_mode

DATA_POSITION_NAME = "hf_lightning_data_position.json"
POSITION_FORMAT = 1
RESTORE_MODES = ("sampler", "dataset_state", "examples_drawn", "replay")
_STATE_PREFIX = "hf_lightning_data_state"
DATA_STATE_PATTERN = re.compile(rf"^{_STATE_PREFIX}(_\d+)?\.safetensors$")
_TENSOR_KEY = "__tensor__"
# Present when a run guard took windows out of the run's path (engine/guard_path.py): one
# {"epoch", "first", "count", "at_step"} entry each; the data then stands that many windows past `global_step`.
SKIPPED_WINDOWS_KEY = "run_guard_skipped"
_SKIPPED_FIELDS = ("epoch", "first", "count", "at_step")


def data_state_file_name(world_size: int, process_index: int) -> str:
    """This process's loader-state file (one per process, named as the RNG files are)."""
    return f"{_STATE_PREFIX}.safetensors" if world_size <= 1 else f"{_STATE_PREFIX}_{process_index}.safetensors"


@dataclass(frozen=True)
class DataPositionRecord:
    """What one save writes about the train data: the run's position and this process's loader state (copied when
    recorded, so a background write keeps the values of its step)."""

    position: dict[str, Any]
    state_json: str | None = None
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


# ---- a state as JSON plus tensors -------------------------------------------------------------------------------


def encode_state(state: Any) -> tuple[str, dict[str, torch.Tensor]]:
    """`state` as JSON text whose tensors are references into the returned dict (copies); a TypeError names a value
    that is neither a tensor nor plain JSON."""
    tensors: dict[str, torch.Tensor] = {}

    def encoded(value: Any, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            name = path or "tensor"
            tensors[name] = value.detach().to("cpu").clone().contiguous()
            return {_TENSOR_KEY: name}
        if isinstance(value, dict):
            if not all(isinstance(key, str) for key in value):
                raise TypeError(f"a key at {path or '<root>'} is not a string")
            return {key: encoded(item, f"{path}.{key}" if path else key) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [encoded(item, f"{path}.{index}") for index, item in enumerate(value)]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise TypeError(f"{type(value).__name__} at {path or '<root>'} is not plain JSON")

    return json.dumps(encoded(state, "")), tensors


def decode_state(text: str, tensors: dict[str, torch.Tensor]) -> Any:
    """The state `encode_state` wrote (tuples come back as lists)."""

    def decoded(value: Any) -> Any:
        if isinstance(value, dict):
            if set(value) == {_TENSOR_KEY}:
                return tensors[value[_TENSOR_KEY]]
            return {key: decoded(item) for key, item in value.items()}
        if isinstance(value, list):
            return [decoded(item) for item in value]
        return value

    return decoded(json.loads(text))


# ---- writing ---------------------------------------------------------------------------------------------------


def write_data_position(folder: str, record: DataPositionRecord) -> None:
    """The run's position file (the checkpoint's commit makes it durable with the other files)."""
    with open(os.path.join(folder, DATA_POSITION_NAME), "w", encoding="utf-8") as handle:
        json.dump(record.position, handle, indent=1)


def write_data_state(folder: str, record: DataPositionRecord, file_name: str) -> None:
    """This process's loader-state file, when the record holds one."""
    if record.state_json is None:
        return
    from safetensors.torch import save_file

    metadata = {"format": str(POSITION_FORMAT), "state": record.state_json}
    save_file(record.tensors, os.path.join(folder, file_name), metadata=metadata)
    give_ordinary_mode(os.path.join(folder, file_name))  # safetensors writes 0600 (core/file_modes.py)


# ---- reading and checking ----------------------------------------------------------------------------------------


_REQUIRED = {
    "format": int,
    "global_step": int,
    "epoch": int,
    "batch": int,
    "end_of_epoch": bool,
    "num_processes": int,
    "num_workers": int,
    "restore": str,
}


def read_data_position(path: str) -> dict[str, Any]:
    """The run's position file, checked for its shape; a damaged file is refused (ValueError naming it)."""
    try:
        with open(path, encoding="utf-8") as handle:
            position = json.load(handle)
    except (OSError, ValueError) as error:
        raise ValueError(_damaged(path, f"it cannot be read as JSON ({error})")) from error
    if not isinstance(position, dict):
        raise ValueError(_damaged(path, "it is not a JSON object"))
    for key, kind in _REQUIRED.items():
        value = position.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(_damaged(path, f"`{key}` is missing or not {kind.__name__}"))
    if position["format"] != POSITION_FORMAT:
        raise ValueError(_damaged(path, f"its format is {position['format']}, this version reads {POSITION_FORMAT}"))
    if position["epoch"] < 0 or position["batch"] < 0 or position["num_processes"] < 1:
        raise ValueError(_damaged(path, "a count is negative"))
    if position["restore"] not in RESTORE_MODES:
        raise ValueError(_damaged(path, f"`restore` is {position['restore']!r}, not one of {RESTORE_MODES}"))
    if not isinstance(position.get("batch_size"), (int, type(None))):
        raise ValueError(_damaged(path, "`batch_size` is not an integer"))
    skipped = position.get(SKIPPED_WINDOWS_KEY, [])
    if not isinstance(skipped, list) or not all(
        isinstance(entry, dict) and all(type(entry.get(key)) is int for key in _SKIPPED_FIELDS) for entry in skipped
    ):
        raise ValueError(_damaged(path, f"`{SKIPPED_WINDOWS_KEY}` is not a list of {_SKIPPED_FIELDS} integers"))
    return position


def windows_left_out(position: dict[str, Any] | None, global_step: int) -> int:
    """How many windows a run guard took out of the path before a checkpoint at `global_step` (0 without one)."""
    if position is None:
        return 0
    return sum(1 for entry in position.get(SKIPPED_WINDOWS_KEY, []) if entry["at_step"] < global_step)


def read_data_state(path: str) -> Any:
    """This process's loader state from its safetensors file (tensors loaded, nothing unpickled)."""
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    except Exception as error:  # safetensors raises its own error types for a damaged header or size
        raise ValueError(_damaged(path, f"it is not a complete safetensors file ({error})")) from error
    if metadata.get("format") != str(POSITION_FORMAT) or "state" not in metadata:
        raise ValueError(_damaged(path, f"its metadata holds no loader state of format {POSITION_FORMAT}"))
    try:
        return decode_state(metadata["state"], tensors)
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(_damaged(path, f"its loader state does not decode ({type(error).__name__}: {error})")) from error


def data_position_problem(folder: str) -> str | None:
    """Why the data-position files of checkpoint `folder` cannot be used (naming the file), or None."""
    try:
        path = os.path.join(folder, DATA_POSITION_NAME)
        position = read_data_position(path) if os.path.isfile(path) else None
        if position is not None and position["restore"] in ("dataset_state", "examples_drawn") and position["batch"]:
            # Mid-pass, the loader state of every process says where its readers stand: the position needs them.
            processes = position["num_processes"]
            for index in range(processes):
                name = data_state_file_name(processes, index)
                if not os.path.isfile(os.path.join(folder, name)):
                    raise ValueError(_damaged(path, f"the loader state it needs, {name}, is missing"))
        for name in sorted(os.listdir(folder)):
            if DATA_STATE_PATTERN.match(name):
                read_data_state(os.path.join(folder, name))
    except ValueError as error:
        return str(error)
    return None


def _damaged(path: str, reason: str) -> str:
    return (
        f"{path}: the data position saved with this checkpoint is damaged: {reason}. Delete the file to resume "
        "by replaying the epoch's batches instead."
    )
