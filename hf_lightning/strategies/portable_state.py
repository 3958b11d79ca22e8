"""A checkpoint's model and optimizer states read into one layout-free form, whichever strategy wrote them.

Every layout we write (one process or DDP: `model.safetensors` + `optimizer.pt`; FSDP full: `pytorch_model_fsdp.bin`
+ `optimizer.bin`; FSDP sharded: the `pytorch_model_fsdp_0/` + `optimizer_0/` distributed checkpoints; tensor
parallel: the one-process files) is read here into full tensors on the CPU: the model keyed by parameter name, the
optimizer keyed by index (`optimizer.pt`, as torch's `Optimizer.state_dict()`) or by parameter name (FSDP's files).
A distributed checkpoint's shards are merged by `torch.distributed.checkpoint` itself, without a process group.
The two optimizer keyings are translated through the resuming optimizer's own parameter order, so a checkpoint
resumes into any strategy: each strategy's checkpoint I/O loads the full form its own way.
"""

from __future__ import annotations

import os
import pathlib
import pickle
from typing import Any

from hf_lightning.core.checkpoint_files import (
    OPTIMIZER_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    read_model_state_dict,
    safe_torch_load,
)

FSDP_MODEL_NAME = "pytorch_model_fsdp"
FSDP_OPTIMIZER_NAME = "optimizer"
# Module names wrappers put between a model and its parameters (FSDP1, activation checkpointing, torch.compile).
_WRAPPER_NAMES = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})
_PLAIN_WEIGHTS = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)


# ---- which layout a checkpoint holds ---------------------------------------------------------------------------


def sharded_model_folder(checkpoint: str) -> str | None:
    """The `pytorch_model_fsdp_0/` distributed checkpoint of a sharded FSDP run, when `checkpoint` holds one."""
    folder = os.path.join(checkpoint, f"{FSDP_MODEL_NAME}_0")
    return folder if os.path.isdir(folder) else None


def sharded_optimizer_folder(checkpoint: str) -> str | None:
    """The `optimizer_0/` distributed checkpoint of a sharded FSDP run, when `checkpoint` holds one."""
    folder = os.path.join(checkpoint, f"{FSDP_OPTIMIZER_NAME}_0")
    return folder if os.path.isdir(folder) else None


def full_fsdp_model_file(checkpoint: str) -> str | None:
    """`pytorch_model_fsdp.bin`, the full FSDP weights, when `checkpoint` holds it."""
    path = os.path.join(checkpoint, f"{FSDP_MODEL_NAME}.bin")
    return path if os.path.isfile(path) else None


def has_plain_weights(checkpoint: str) -> bool:
    """Whether `checkpoint` holds whole-model weights in the reference's plain files."""
    return any(os.path.isfile(os.path.join(checkpoint, name)) for name in _PLAIN_WEIGHTS)


def has_model_state(checkpoint: str) -> bool:
    """Whether any layout's model weights are in `checkpoint`."""
    return bool(
        has_plain_weights(checkpoint) or full_fsdp_model_file(checkpoint) or sharded_model_folder(checkpoint)
    )


def optimizer_file(checkpoint: str) -> str | None:
    """The optimizer state a resume reads: `optimizer.pt`, FSDP's `optimizer.bin` or its `optimizer_0/` folder."""
    for name in (OPTIMIZER_NAME, f"{FSDP_OPTIMIZER_NAME}.bin", f"{FSDP_OPTIMIZER_NAME}_0"):
        if os.path.exists(os.path.join(checkpoint, name)):
            return os.path.join(checkpoint, name)
    return None


# ---- reading -----------------------------------------------------------------------------------------------


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles a distributed checkpoint's `.metadata` with only what torch writes there: its checkpoint classes,
    torch's dtypes / layouts / memory formats, `torch.Size` and paths; any other global (code that would run) is
    refused."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        found = super().find_class(module, name)
        if module.startswith("torch.distributed.checkpoint.") and isinstance(found, type):
            return found
        if module == "torch" and (
            found is torch.Size or isinstance(found, (torch.dtype, torch.layout, torch.memory_format))
        ):
            return found
        if (module, name) in (("collections", "OrderedDict"), ("torch.serialization", "_get_layout")):
            return found  # _get_layout: a layout by its name, how torch pickles `torch.strided`
        if module == "pathlib" and isinstance(found, type) and issubclass(found, pathlib.PurePath):
            return found  # the folder torch recorded in the metadata
        raise pickle.UnpicklingError(f"{module}.{name} is not a distributed-checkpoint metadata class")


def check_distributed_checkpoint(folder: str) -> None:
    """Before torch unpickles a distributed checkpoint's `.metadata` (unrestricted): check that it holds only torch's
    checkpoint classes (ValueError naming the file otherwise)."""
    path = os.path.join(folder, ".metadata")
    try:
        with open(path, "rb") as stream:
            _MetadataUnpickler(stream).load()
    except (OSError, pickle.UnpicklingError, AttributeError, ImportError, EOFError, ValueError) as error:
        raise ValueError(
            f"Refusing to load {path}: it is not a distributed-checkpoint metadata file torch wrote ({error})"
        ) from error


def safe_load_planner(base: type) -> Any:
    """An instance of the load planner class `base` whose non-tensor entries (an optimizer's parameter groups) are
    read with `torch.load(weights_only=True)` first, so none runs pickled code (torch's planner reads them
    unrestricted)."""
    import torch

    class SafeBytesPlanner(base):
        def load_bytes(self, read_item: Any, value: Any) -> None:
            position = value.tell()
            torch.load(value, weights_only=True)  # refuses pickled code
            value.seek(position)
            super().load_bytes(read_item, value)

    return SafeBytesPlanner()


def read_distributed_checkpoint(folder: str) -> dict[str, Any]:
    """Every entry of a `torch.distributed.checkpoint` folder as full tensors on the CPU, the shards merged by torch
    itself; no process group is used (each process that calls it reads the whole state), and no pickled code runs."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner, _load_state_dict

    check_distributed_checkpoint(folder)
    state: dict[str, Any] = {}
    _load_state_dict(
        state,
        storage_reader=dcp.FileSystemReader(folder),
        planner=safe_load_planner(_EmptyStateDictLoadPlanner),
        no_dist=True,
    )
    return state


def read_full_model_state(checkpoint: str) -> dict[str, Any] | None:
    """The whole model's weights in `checkpoint`, keyed by parameter name, on the CPU; None when it holds none.

    The plain files first (`model.safetensors`, ...), then FSDP's full file, then the sharded folder merged."""
    state = read_model_state_dict(checkpoint)
    if state is not None:
        return state
    path = full_fsdp_model_file(checkpoint)
    if path is not None:
        return safe_torch_load(path)
    folder = sharded_model_folder(checkpoint)
    if folder is not None:
        return read_distributed_checkpoint(folder)["model"]
    return None


def read_full_optimizer_state(checkpoint: str) -> dict[str, Any] | None:
    """The whole optimizer state in `checkpoint` on the CPU (keyed by index or by parameter name, as written)."""
    path = optimizer_file(checkpoint)
    if path is None:
        return None
    if os.path.isdir(path):
        return read_distributed_checkpoint(path)["optimizer"]
    return safe_torch_load(path)


# ---- optimizer keyings ---------------------------------------------------------------------------------------


def parameter_name(name: str) -> str:
    """A parameter's name in the user's model: the wrappers' module names left out."""
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_NAMES)


def optimizer_parameter_names(model: Any, optimizer: Any) -> list[list[str]]:
    """Per parameter group of `optimizer` (its torch optimizer inside Lightning's), the names of its parameters in
    `model` (the user's model, as the strategy holds it)."""
    optimizer = getattr(optimizer, "_optimizer", optimizer)
    names = {id(param): parameter_name(name) for name, param in model.named_parameters()}
    groups = []
    for group in optimizer.param_groups:
        missing = [index for index, param in enumerate(group["params"]) if id(param) not in names]
        if missing:
            raise ValueError(
                "The optimizer holds parameters the model does not name, so its checkpoint state cannot be matched "
                "to them by name; build the optimizer from the model's own parameters."
            )
        groups.append([names[id(param)] for param in group["params"]])
    return groups


def is_keyed_by_name(state: dict[str, Any]) -> bool:
    """Whether an optimizer state dict names its parameters (FSDP's files) rather than numbering them."""
    return any(isinstance(param, str) for group in state.get("param_groups", []) for param in group["params"])


def _check_groups(state: dict[str, Any], names: list[list[str]]) -> None:
    saved = [len(group["params"]) for group in state["param_groups"]]
    wanted = [len(group) for group in names]
    if saved != wanted:
        raise ValueError(
            f"The checkpoint's optimizer has parameter groups of sizes {saved}, this run's optimizer {wanted}: the "
            "optimizer state cannot be matched to the parameters. Resume with the optimizer (and parameter groups) "
            "of the run that saved it."
        )


def optimizer_state_by_name(state: dict[str, Any], names: list[list[str]]) -> dict[str, Any]:
    """An index-keyed optimizer state (`optimizer.pt`) keyed by parameter name, through the resuming optimizer's
    parameter order `names` (`optimizer_parameter_names`); a name-keyed state is returned as it is."""
    if is_keyed_by_name(state):
        return state
    _check_groups(state, names)
    by_index: dict[Any, str] = {}
    groups = []
    for group, group_names in zip(state["param_groups"], names):
        by_index.update(zip(group["params"], group_names))
        groups.append({**group, "params": list(group_names)})
    return {"state": {by_index[index]: value for index, value in state["state"].items()}, "param_groups": groups}


def optimizer_state_by_index(state: dict[str, Any], names: list[list[str]]) -> dict[str, Any]:
    """A name-keyed optimizer state (FSDP's files) keyed by index as `Optimizer.load_state_dict` takes it, through
    the resuming optimizer's parameter order `names`; an index-keyed state is returned as it is."""
    if not is_keyed_by_name(state):
        return state
    _check_groups(state, names)
    index = {name: position for position, name in enumerate(name for group in names for name in group)}
    unknown = sorted(set(state["state"]) - set(index))
    if unknown:
        raise ValueError(
            f"The checkpoint's optimizer holds state for parameters this model does not have ({', '.join(unknown[:5])})."
        )
    groups = [
        {**group, "params": [index[name] for name in group_names]}
        for group, group_names in zip(state["param_groups"], names)
    ]
    return {"state": {index[name]: value for name, value in state["state"].items()}, "param_groups": groups}
