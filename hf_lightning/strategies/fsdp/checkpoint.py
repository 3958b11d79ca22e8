"""Checkpoint files of an FSDP run, named and laid out as the reference writes them (accelerate's
`save_fsdp_model` / `save_fsdp_optimizer`, called by transformers' `Trainer`).

| fsdp_config state_dict_type | model files                                                   | optimizer files |
|-----------------------------|---------------------------------------------------------------|-----------------|
| FULL_STATE_DICT (default)   | `model.safetensors` (+ config) and `pytorch_model_fsdp.bin`, both gathered on rank 0 | `optimizer.bin` (rank 0) |
| SHARDED_STATE_DICT          | `pytorch_model_fsdp_0/` (torch distributed checkpoint, every rank writes its shard) | `optimizer_0/` |

`scheduler.pt`, the RNG files and `trainer_state.json` are written as without FSDP. As in the reference, a sharded
run's `save_model()` writes no weights (nor `training_args.bin`). Every function here is a collective: all ranks
call it. Files are read with `weights_only=True`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from typing import Any

import torch
from torch import nn

from hf_lightning.core.checkpoint_files import SCHEDULER_NAME
from hf_lightning.strategies.checkpoint_io import StrategyCheckpointIO, weights_files_present
from hf_lightning.strategies.distributed import barrier
from hf_lightning.strategies.fsdp.policies import is_fsdp1_model

logger = logging.getLogger(__name__)

__all__ = [
    "FSDP_MODEL_NAME",
    "FSDP_OPTIMIZER_NAME",
    "fsdp_model_files_present",
    "fsdp_optimizer_files_present",
    "gather_full_state_dict",
    "load_fsdp_model",
    "load_fsdp_optimizer",
    "FSDPCheckpointIO",
    "save_fsdp_model",
    "save_fsdp_optimizer",
    "save_fsdp_weights",
]

FSDP_MODEL_NAME = "pytorch_model_fsdp"
FSDP_OPTIMIZER_NAME = "optimizer"


def _is_full(trainer: Any) -> bool:
    """Whether the run saves full state dicts (`FULL_STATE_DICT`) rather than shards."""
    return trainer.plan.strategy.fsdp.state_dict_type == "FULL_STATE_DICT"


def required_model_files(trainer: Any) -> str:
    """The FSDP weights a resume of this run reads: `pytorch_model_fsdp.bin` (full) or `pytorch_model_fsdp_0/`."""
    return f"{FSDP_MODEL_NAME}.bin" if _is_full(trainer) else f"{FSDP_MODEL_NAME}_0"


def check_resumable(trainer: Any, checkpoint: str) -> None:
    """Before training starts: refuse a checkpoint without the FSDP weights this run's `state_dict_type` loads
    (a plain `model.safetensors`, or the other layout), instead of failing after the model is wrapped."""
    needed = required_model_files(trainer)
    if not os.path.exists(os.path.join(checkpoint, needed)):
        layout = trainer.plan.strategy.fsdp.state_dict_type
        raise ValueError(
            f"{checkpoint} has no {needed}, the FSDP weights this run resumes from "
            f"(fsdp_config['state_dict_type']={layout!r}); resume from a checkpoint of an FSDP run with the same "
            "state_dict_type, or load the weights into the model before training and start without "
            "resume_from_checkpoint"
        )


def _multi_process(trainer: Any) -> bool:
    # accelerate offloads a full state dict to the CPU, on rank 0 only, when there is more than one process.
    return trainer.args.world_size > 1


def _fsdp1_context(model: nn.Module, full: bool, multi_process: bool) -> Any:
    """FSDP1's state-dict mode as accelerate's plugin configures it."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType
    from torch.distributed.fsdp.fully_sharded_data_parallel import (
        FullOptimStateDictConfig,
        FullStateDictConfig,
        ShardedOptimStateDictConfig,
        ShardedStateDictConfig,
    )

    # On a CPU run the tensors are on the CPU already, and FSDP1's offload there crashes the process (torch 2.13).
    offload = model.compute_device.type != "cpu"
    if full:
        return FSDP.state_dict_type(
            model,
            StateDictType.FULL_STATE_DICT,
            FullStateDictConfig(offload_to_cpu=multi_process and offload, rank0_only=multi_process),
            FullOptimStateDictConfig(offload_to_cpu=offload, rank0_only=True),
        )
    return FSDP.state_dict_type(
        model,
        StateDictType.SHARDED_STATE_DICT,
        ShardedStateDictConfig(offload_to_cpu=offload),
        ShardedOptimStateDictConfig(offload_to_cpu=offload),
    )


def _fsdp2_options(full: bool, multi_process: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    if full:
        return StateDictOptions(
            full_state_dict=True, cpu_offload=multi_process, broadcast_from_rank0=multi_process
        )
    return StateDictOptions(full_state_dict=False, cpu_offload=True)


def _state_dict_mode(trainer: Any, full: bool) -> tuple[Any, Any]:
    """(context, options): FSDP1's state-dict-type context, or FSDP2's `StateDictOptions`."""
    model = trainer.model_wrapped
    if is_fsdp1_model(model):
        return _fsdp1_context(model, full, _multi_process(trainer)), None
    return contextlib.nullcontext(), _fsdp2_options(full, _multi_process(trainer))


def _model_state(model: nn.Module, options: Any) -> dict[str, Any]:
    if options is None:
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=options)


def gather_full_state_dict(model: nn.Module) -> dict[str, Any]:
    """The whole model's state dict on rank 0, on the CPU (empty on the other ranks): accelerate's
    `get_state_dict`, which the reference's `save_model` writes."""
    if is_fsdp1_model(model):
        with _fsdp1_context(model, full=True, multi_process=True):
            return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, cpu_offload=True)
    return _model_state(model, options)


# ---- saving ------------------------------------------------------------------------------------------------


def save_fsdp_weights(trainer: Any, output_dir: str) -> None:
    """`save_model` under FSDP: a full state dict goes through the usual `_save` (model.safetensors, config,
    training_args.bin); a sharded run writes nothing there, as the reference."""
    if _is_full(trainer):
        trainer._save(output_dir, state_dict=gather_full_state_dict(trainer.model_wrapped))


def save_fsdp_model(trainer: Any, output_dir: str) -> None:
    """`pytorch_model_fsdp.bin` (full, rank 0) or the `pytorch_model_fsdp_0/` distributed checkpoint."""
    full = _is_full(trainer)
    context, options = _state_dict_mode(trainer, full)
    os.makedirs(output_dir, exist_ok=True)
    with context:
        _write_state(
            trainer, output_dir, FSDP_MODEL_NAME, "model", _model_state(trainer.model_wrapped, options), full
        )


def _write_state(
    trainer: Any, output_dir: str, name: str, key: str, state: dict[str, Any], full: bool
) -> None:
    """Rank 0 writes the full state to `<name>.bin`; or every rank its shard, under `key`, to the distributed
    checkpoint `<name>_0/` (accelerate's file names)."""
    if full:
        if trainer.args.process_index == 0:
            torch.save(state, os.path.join(output_dir, f"{name}.bin"))
        return
    import torch.distributed.checkpoint as dcp

    folder = os.path.join(output_dir, f"{name}_0")
    os.makedirs(folder, exist_ok=True)
    dcp.save({key: state}, storage_writer=dcp.FileSystemWriter(folder))


def _optimizer_state(trainer: Any, options: Any) -> dict[str, Any]:
    model, optimizer = trainer.model_wrapped, _plain_optimizer(trainer.optimizer)
    if options is None:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return FSDP.optim_state_dict(model, optimizer)
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=options)


def _plain_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside Lightning's `LightningOptimizer` (the facade may hold either)."""
    return getattr(optimizer, "_optimizer", optimizer)


def save_fsdp_optimizer(trainer: Any, output_dir: str) -> None:
    """`optimizer.bin` (full, rank 0) or the `optimizer_0/` distributed checkpoint."""
    full = _is_full(trainer)
    context, options = _state_dict_mode(trainer, full)
    with context:
        _write_state(
            trainer, output_dir, FSDP_OPTIMIZER_NAME, "optimizer", _optimizer_state(trainer, options), full
        )


# ---- loading -----------------------------------------------------------------------------------------------


def fsdp_model_files_present(checkpoint: str) -> bool:
    """Whether `checkpoint` holds FSDP model files (the reference's `is_fsdp_ckpt`)."""
    return _fsdp_files_present(checkpoint, FSDP_MODEL_NAME)


def _fsdp_files_present(checkpoint: str, name: str) -> bool:
    """`<name>.bin` (a full state), or a folder whose name contains `name` (a distributed checkpoint)."""
    if os.path.isfile(os.path.join(checkpoint, f"{name}.bin")):
        return True
    return os.path.isdir(checkpoint) and any(
        name in entry and os.path.isdir(os.path.join(checkpoint, entry)) for entry in os.listdir(checkpoint)
    )


def load_fsdp_model(trainer: Any, input_dir: str) -> Any:
    """Load `pytorch_model_fsdp.bin` or `pytorch_model_fsdp_0/` into the wrapped model (accelerate's
    `load_fsdp_model`); the reference resumes and loads the best model this way under FSDP."""
    full = _is_full(trainer)
    model = trainer.model_wrapped
    context, options = _state_dict_mode(trainer, full)
    barrier()
    with context:
        if full:
            path = os.path.join(input_dir, f"{FSDP_MODEL_NAME}.bin")
            if not os.path.isfile(path):
                raise ValueError(
                    f"{input_dir} has no {FSDP_MODEL_NAME}.bin, the full FSDP weights this run loads "
                    "(fsdp_config['state_dict_type']='FULL_STATE_DICT'); resume from a checkpoint of an FSDP run "
                    "with the same state_dict_type"
                )
            # FSDP2 broadcasts from rank 0; FSDP1 loads the whole dict on every rank.
            reads = options is None or trainer.args.process_index == 0 or not _multi_process(trainer)
            state = torch.load(path, weights_only=True, map_location="cpu") if reads else {}
        else:
            import torch.distributed.checkpoint as dcp

            folder = os.path.join(input_dir, f"{FSDP_MODEL_NAME}_0")
            if not os.path.isdir(folder):
                raise ValueError(
                    f"{input_dir} has no {FSDP_MODEL_NAME}_0/ folder, the sharded FSDP weights this run loads "
                    "(fsdp_config['state_dict_type']='SHARDED_STATE_DICT'); resume from a checkpoint of an FSDP run "
                    "with the same state_dict_type"
                )
            holder = {"model": _model_state(model, options)}
            dcp.load(holder, storage_reader=dcp.FileSystemReader(folder))
            state = holder["model"]
        if options is None:
            result = model.load_state_dict(state)
        else:
            from torch.distributed.checkpoint.state_dict import set_model_state_dict

            result = set_model_state_dict(model, state, options=options)
    barrier()
    return result


def load_fsdp_optimizer(trainer: Any, input_dir: str) -> None:
    """Load `optimizer.bin` or `optimizer_0/` into the run's optimizer (accelerate's `load_fsdp_optimizer`)."""
    full = _is_full(trainer)
    model, optimizer = trainer.model_wrapped, _plain_optimizer(trainer.optimizer)
    context, options = _state_dict_mode(trainer, full)
    barrier()
    with context:
        if full:
            state = None
            if trainer.args.process_index == 0:  # rank 0 reads; FSDP hands the state to the other ranks
                path = os.path.join(input_dir, f"{FSDP_OPTIMIZER_NAME}.bin")
                state = torch.load(path, weights_only=True, map_location="cpu")
            if options is not None and state is None:
                state = {}
        else:
            state = _read_sharded_optimizer(
                trainer, options, os.path.join(input_dir, f"{FSDP_OPTIMIZER_NAME}_0")
            )
        if options is None:
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            optimizer.load_state_dict(FSDP.optim_state_dict_to_load(model, optimizer, state))
        else:
            from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

            set_optimizer_state_dict(model, optimizer, state, options=options)
    barrier()


def _read_sharded_optimizer(trainer: Any, options: Any, folder: str) -> dict[str, Any]:
    """The `optimizer_0/` distributed checkpoint, shaped after this run's shards.

    FSDP2's template (`get_optimizer_state_dict`) creates the optimizer's state first, so every saved entry has a
    slot to load into; FSDP1's `optim_state_dict` would be empty before the first step, so its layout is read from
    the checkpoint's metadata instead (`load_sharded_optimizer_state_dict`, as Lightning's FSDP strategy does).
    """
    import torch.distributed.checkpoint as dcp

    reader = dcp.FileSystemReader(folder)
    if options is not None:
        holder = {"optimizer": _optimizer_state(trainer, options)}
        dcp.load(holder, storage_reader=reader)
        return holder["optimizer"]
    from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict

    model_state = trainer.model_wrapped.state_dict()
    return load_sharded_optimizer_state_dict(model_state, optimizer_key="optimizer", storage_reader=reader)[
        "optimizer"
    ]


def fsdp_optimizer_files_present(checkpoint: str) -> bool:
    """Whether `checkpoint` holds FSDP optimizer files (`optimizer.bin` or an `optimizer_*` folder)."""
    return _fsdp_files_present(checkpoint, FSDP_OPTIMIZER_NAME)


class FSDPCheckpointIO(StrategyCheckpointIO):
    """accelerate's FSDP files: `pytorch_model_fsdp.bin` / `optimizer.bin` (full) or the `pytorch_model_fsdp_0/` /
    `optimizer_0/` distributed checkpoints (sharded); every method that writes or loads them runs on all ranks."""

    loads_weights_before_training = False  # into the wrapped model, once the strategy has built it
    weights_files_required = False
    supports_background_writes = False

    def check_resumable(self, trainer: Any, checkpoint: str) -> None:
        if not weights_files_present(checkpoint) and not fsdp_model_files_present(checkpoint):
            raise ValueError(f"Can't find a valid checkpoint at {checkpoint}")
        check_resumable(trainer, checkpoint)

    def optimizer_files(self, checkpoint: str) -> list[str]:
        # The FSDP optimizer files are read at train start; the scheduler is listed only alongside them.
        if fsdp_optimizer_files_present(checkpoint) and os.path.isfile(os.path.join(checkpoint, SCHEDULER_NAME)):
            return [SCHEDULER_NAME]
        return []

    def load_weights(self, trainer: Any, checkpoint: str, model: Any) -> None:
        load_fsdp_model(trainer, checkpoint)

    def load_best_weights(self, trainer: Any, best_dir: str) -> None:
        load_fsdp_model(trainer, best_dir)

    def load_optimizer_and_scheduler(self, trainer: Any, files: Any) -> None:
        """Once the model is wrapped and the optimizer built: the model files (through the trainer's
        `_load_from_checkpoint`, a subclass's override included), then the optimizer and the scheduler when the
        checkpoint has both (`files` lists `scheduler.pt` only when the FSDP optimizer files are there too)."""
        trainer._load_from_checkpoint(files.checkpoint, trainer.model_wrapped)
        if SCHEDULER_NAME in files.names:
            load_fsdp_optimizer(trainer, files.checkpoint)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*save or load the state of the optimizer.*")
                trainer.lr_scheduler.load_state_dict(files.take(SCHEDULER_NAME))

    def save_optimizer_and_scheduler(self, trainer: Any, output_dir: str, reach: Any) -> None:
        """The model and optimizer files, named as accelerate names them; then `scheduler.pt`."""
        save_fsdp_model(trainer, output_dir)
        save_fsdp_optimizer(trainer, output_dir)
        if trainer.args.should_save:
            self._save_scheduler(trainer, output_dir, reach)

    def save_model(self, trainer: Any, output_dir: str) -> None:
        save_fsdp_weights(trainer, output_dir)
