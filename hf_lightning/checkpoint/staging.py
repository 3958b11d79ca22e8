"""One checkpoint as plain data, gathered on the training thread, and the writing of it.

`stage` reads what a checkpoint holds (the model's tensors, the optimizer / scheduler / scaler state dicts, the RNG
states, the data position, the trainer state, the training arguments as a plain dict) into a `StagedCheckpoint`:
live for a synchronous save, copied into CPU memory for a background write (`copy_state`), as torchtitan's
`CheckpointManager` stages a state dict. The `write_*` functions put it on disk in the reference's layout; the
facade's reference-named save hooks write through the same functions, so both paths give the same files.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import logging
import os
import random
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hf_lightning.checkpoint.fault_points import reach
from hf_lightning.checkpoint.output_folder import apply_umask
from hf_lightning.checkpoint.save_imports import deepspeed_probe_skipped_while_unloaded
from hf_lightning.core.checkpoint_files import (
    SAFE_WEIGHTS_NAME,
    SCALER_NAME,
    TRAINER_STATE_NAME,
    TRAINING_ARGS_NAME,
    rng_state_file_name,
)
from hf_lightning.core.enums import enum_value
from hf_lightning.data.position_files import data_state_file_name, write_data_position, write_data_state
from hf_lightning.strategies.checkpoint_io import scheduler_state

if TYPE_CHECKING:
    import lightning.pytorch as pl
    import torch

logger = logging.getLogger(__name__)


class StagingRun(Protocol):
    """The `train()` call in progress as a save reads it: whether Lightning's `fit` runs, its trainer, its values."""

    fitting: bool
    lightning_trainer: pl.Trainer | None
    values: Any  # engine.schedule.TrainingValues (total_train_batch_size); None before the first attempt


class StagingSource(Protocol):
    """What `stage` reads of the trainer: the state a checkpoint holds, the arguments and plan that shape it."""

    args: Any  # TrainingArguments (hf_lightning's or transformers')
    plan: Any  # translation.plan.Plan: its checkpointing section
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    lr_scheduler: Any
    lightning_trainer: pl.Trainer | None  # None outside train() (its precision plugin holds the grad scaler)
    processing_class: Any
    data_collator: Any
    state: Any  # callbacks.state.TrainerState
    _training_run: StagingRun | None

    def _refresh_stateful_callbacks(self) -> None: ...
    def _data_position_record(self) -> Any: ...


@dataclass(frozen=True)
class StagedCheckpoint:
    """What one process writes into one checkpoint, as it was at the save. The `model` object is kept for its
    `save_pretrained` (config files beside the weights); `model_state` None: the model's own state dict (a
    synchronous save). File fields are None where this process writes no such file."""

    should_save: bool
    world_size: int
    process_index: int
    save_only_model: bool
    save_total_limit: int | None
    global_step: int
    total_train_batch_size: int | None
    state: Any  # the trainer state (TrainerState): trainer_state.json, the best checkpoint rotation keeps
    data_position: Any  # data/position_files.py's DataPositionRecord, or None
    model: Any = None
    model_state: dict | None = None
    processing_class: Any = None
    data_collator: Any = None  # whose tokenizer is saved when there is no processing class (the reference's)
    training_args: dict | None = None
    optimizer_state: dict | None = None
    scheduler_state: dict | None = None
    scaler_state: dict | None = None
    rng_states: dict | None = None


def stage(trainer: StagingSource, copy_tensors: Any = None, files: bool = True, whole: bool = False) -> StagedCheckpoint:
    """Gather one checkpoint from `trainer` on the training thread. `copy_tensors` (async_writes.copy_state): copy
    every state off the device, for a background write; `files=False`: the records alone (the trainer's overridden
    save hooks write the files); `whole`: every state even with `save_only_model` (a run guard's snapshot)."""
    args, checkpointing = trainer.args, trainer.plan.checkpointing
    should_save, save_only_model = args.should_save, checkpointing.save_only_model and not whole
    keep = copy_tensors if copy_tensors is not None else (lambda value: value)
    run = trainer._training_run
    values = run.values if run is not None else None
    fields: dict[str, Any] = {}
    if files:
        if should_save:
            fields["model"] = trainer.model
            fields["model_state"] = None if copy_tensors is None else copy_tensors(trainer.model.state_dict())
            fields["processing_class"] = trainer.processing_class
            fields["data_collator"] = trainer.data_collator
            fields["training_args"] = training_args_to_plain_dict(args)
        if not save_only_model:
            if should_save:
                fields["optimizer_state"] = keep(trainer.optimizer.state_dict())
                fields["scheduler_state"] = keep(scheduler_state(trainer.lr_scheduler))
                lightning_trainer = trainer.lightning_trainer
                plugin = lightning_trainer.precision_plugin if lightning_trainer is not None else None
                scaler = getattr(plugin, "scaler", None)  # a mixed-precision plugin's grad scaler (fp16), or None
                fields["scaler_state"] = keep(scaler.state_dict()) if scaler is not None else None
            fields["rng_states"] = rng_states(args)
    if should_save:
        trainer._refresh_stateful_callbacks()
    state = trainer.state if copy_tensors is None else _copied_state(trainer.state)
    return StagedCheckpoint(
        should_save=should_save,
        world_size=args.world_size,
        process_index=args.process_index,
        save_only_model=save_only_model,
        save_total_limit=checkpointing.save_total_limit,
        global_step=trainer.state.global_step,
        total_train_batch_size=getattr(values, "total_train_batch_size", None),
        state=state,
        data_position=None if save_only_model else trainer._data_position_record(),
        **fields,
    )


def _copied_state(state: Any) -> Any:
    """A point-in-time copy of the trainer state. Its log history, which grows with the run, is copied entry by entry
    (each a flat dict of numbers and strings) rather than deep-copied, so a copy costs little late in a long run."""
    history = state.log_history
    return copy.deepcopy(state, {id(history): [dict(entry) for entry in history]})


# ---- the files --------------------------------------------------------------------------------------------------


def write_model_folder(
    output_dir: str, model: Any, state_dict: dict | None, processing_class: Any, data_collator: Any, training_args: dict
) -> None:
    """The model's weights (`save_pretrained` or a flat safetensors file), the processing class's files and
    `training_args.bin` (a plain dict), as the reference's `_save` writes them. The saving process only."""
    import torch

    os.makedirs(output_dir, exist_ok=True)
    logger.info(f"Saving model checkpoint to {output_dir}")
    reach("model")
    with deepspeed_probe_skipped_while_unloaded():
        write_weights(output_dir, model, state_dict)
    apply_umask(output_dir)
    processing_class = processing_class_to_save(processing_class, data_collator)
    if processing_class is not None:
        reach("processing_class")
        processing_class.save_pretrained(output_dir)
    reach("training_args")
    torch.save(training_args, os.path.join(output_dir, TRAINING_ARGS_NAME))


def write_weights(output_dir: str, model: Any, state_dict: dict | None) -> None:
    """The weights alone: the model's `save_pretrained` (unwrapped first) or a flat safetensors file."""
    import safetensors.torch

    if is_pretrained_model(model):
        model.save_pretrained(output_dir, state_dict=state_dict, is_main_process=True)
        return
    if state_dict is None:
        state_dict = model.state_dict()
    unwrapped = unwrap_model(model)
    if is_pretrained_model(unwrapped):
        unwrapped.save_pretrained(output_dir, state_dict=state_dict, is_main_process=True)
    else:
        logger.info("Trainer.model is not a `PreTrainedModel`, only saving its state dict.")
        safetensors.torch.save_file(state_dict, os.path.join(output_dir, SAFE_WEIGHTS_NAME), metadata={"format": "pt"})


def write_scaler(output_dir: str, scaler_state: dict) -> None:
    """`scaler.pt`: the AMP grad scaler's state (fp16)."""
    import torch

    torch.save(scaler_state, os.path.join(output_dir, SCALER_NAME))


def write_rng_state(output_dir: str, states: dict, world_size: int, process_index: int) -> None:
    """`rng_state.pth` (`rng_state_<rank>.pth` when distributed) with the reference's keys. Every process."""
    import torch

    os.makedirs(output_dir, exist_ok=True)
    reach("rng")
    torch.save(states, os.path.join(output_dir, rng_state_file_name(world_size, process_index)))


def write_records(staged: StagedCheckpoint, temporary_dir: str, rng_dir: str | None) -> None:
    """Where the train data stands (this process's loader state beside its RNG file, the run's position by the
    saving process; data/position_files.py), then `trainer_state.json`."""
    record = staged.data_position
    if record is not None:
        write_data_state(rng_dir or temporary_dir, record, data_state_file_name(staged.world_size, staged.process_index))
    if staged.should_save:
        if record is not None:
            write_data_position(temporary_dir, record)
        reach("trainer_state")
        staged.state.save_to_json(os.path.join(temporary_dir, TRAINER_STATE_NAME))


# ---- the values ---------------------------------------------------------------------------------------------------


def rng_states(args: Any) -> dict[str, Any]:
    """This process's Python, numpy, CPU (and CUDA) generator states, under the reference's keys."""
    import numpy as np
    import torch

    states = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        if enum_value(args.parallel_mode) == "distributed":
            states["cuda"] = torch.cuda.random.get_rng_state_all()
        else:
            states["cuda"] = torch.cuda.random.get_rng_state()
    return states


def processing_class_to_save(processing_class: Any, data_collator: Any) -> Any:
    """The processing class a model folder gets: the trainer's, else the data collator's tokenizer (the reference's
    fallback, said in the log)."""
    if processing_class is not None:
        return processing_class
    tokenizer = getattr(data_collator, "tokenizer", None)
    if tokenizer is not None:
        logger.info("Saving Trainer.data_collator.tokenizer by default as Trainer.processing_class is `None`")
    return tokenizer


def is_pretrained_model(model: Any) -> bool:
    """Duck-typed `PreTrainedModel` (or PEFT model): it saves itself with `save_pretrained` and has a `config`."""
    return callable(getattr(model, "save_pretrained", None)) and hasattr(model, "config")


def unwrap_model(model: Any) -> Any:
    """The user's module inside DDP / DataParallel (`.module`) and `torch.compile` (`._orig_mod`) wrappers."""
    import torch

    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


def _plain(value: Any, field: str) -> Any:
    """`value` as types `torch.load(weights_only=True)` accepts (containers of str / numbers / bool / None)."""
    import torch

    if value is None or isinstance(value, (bool, int, float, str, torch.dtype)):
        return value
    if isinstance(value, enum.Enum):
        return _plain(value.value, field)
    if isinstance(value, dict):
        return {_plain(key, field): _plain(item, field) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(item, field) for item in value)
    if isinstance(value, (set, frozenset)):
        return {_plain(item, field) for item in value}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if callable(getattr(value, "to_dict", None)):
        return _plain(value.to_dict(), field)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value), field)
    warnings.warn(
        f"training_args.bin: field {field!r} holds a {type(value).__name__}, which is not a plain type; it is "
        "stored as its str() so the file stays loadable with torch.load(weights_only=True).",
        stacklevel=3,
    )
    return str(value)


def training_args_to_plain_dict(args: Any) -> dict[str, Any]:
    """`args.to_dict()` as plain types, with every `*_token` field replaced by its `<FIELD_TOKEN>` placeholder.

    The reference's `to_dict` already redacts tokens; redacting again here keeps a secret off disk even when a
    foreign arguments object does not.
    """
    to_dict = getattr(args, "to_dict", None)
    if not callable(to_dict):
        raise TypeError(
            f"Cannot save the training arguments: {type(args).__name__} has no `to_dict()`. Pass a "
            "`TrainingArguments` (hf_lightning's or transformers')."
        )
    plain = {}
    for key, value in to_dict().items():
        plain[key] = f"<{key.upper()}>" if key.endswith("_token") else _plain(value, key)
    return plain
