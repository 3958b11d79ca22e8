"""Checkpoint files of an FSDP run, named and laid out as the reference writes them (accelerate's
`save_fsdp_model` / `save_fsdp_optimizer`, called by transformers' `Trainer`).

| fsdp_config state_dict_type | model files                                                   | optimizer files |
|-----------------------------|---------------------------------------------------------------|-----------------|
| FULL_STATE_DICT (default)   | `model.safetensors` (+ config) and `pytorch_model_fsdp.bin`, both gathered on rank 0 | `optimizer.bin` (rank 0) |
| SHARDED_STATE_DICT          | `pytorch_model_fsdp_0/` (torch distributed checkpoint, every rank writes its shard) | `optimizer_0/` |

`scheduler.pt`, the RNG files and `trainer_state.json` are written as without FSDP. A sharded checkpoint also holds
the model's `config.json`, and a sharded run's `save_model()` outside checkpoints writes the gathered full weights
(the reference writes nothing there). Any of these layouts resumes here (strategies/portable_state.py). Every function here is a collective: all ranks
call it. Files are read with `weights_only=True`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hf_lightning.core.checkpoint_files import SCHEDULER_NAME, safe_torch_load
from hf_lightning.strategies.checkpoint_io import (
    StrategyCheckpointIO,
    plain_optimizer,
    refuse_deepspeed_checkpoint,
)
from hf_lightning.strategies.distributed import barrier
from hf_lightning.strategies.fsdp.policies import is_fsdp1_model
from hf_lightning.strategies.portable_state import (
    FSDP_MODEL_NAME,
    FSDP_OPTIMIZER_NAME,
    check_distributed_checkpoint,
    full_fsdp_model_file,
    has_model_state,
    has_plain_weights,
    is_keyed_by_name,
    optimizer_file,
    optimizer_parameter_names,
    optimizer_state_by_name,
    read_full_model_state,
    read_full_optimizer_state,
    safe_load_planner,
    sharded_model_folder,
    sharded_optimizer_folder,
)

if TYPE_CHECKING:
    from hf_lightning.args.training_args import TrainingArguments
    from hf_lightning.strategies.ports import CheckpointIOOwner
    from hf_lightning.translation.plan import Plan

logger = logging.getLogger(__name__)

__all__ = [
    "FSDP_MODEL_NAME",
    "FSDP_OPTIMIZER_NAME",
    "gather_full_state_dict",
    "load_fsdp_model",
    "load_fsdp_optimizer",
    "FSDPCheckpointIO",
    "save_fsdp_model",
    "save_fsdp_optimizer",
    "save_fsdp_weights",
    "saves_full_state",
]


def saves_full_state(plan: Plan) -> bool:
    """Whether the run saves full state dicts (`FULL_STATE_DICT`) rather than shards."""
    return plan.strategy.fsdp.state_dict_type == "FULL_STATE_DICT"


def _multi_process(args: TrainingArguments) -> bool:
    # accelerate offloads a full state dict to the CPU, on rank 0 only, when there is more than one process.
    return args.world_size > 1


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


def _state_dict_mode(model: nn.Module, full: bool, args: TrainingArguments) -> tuple[Any, Any]:
    """(context, options) for the wrapped `model`: FSDP1's state-dict-type context, or FSDP2's `StateDictOptions`."""
    if is_fsdp1_model(model):
        return _fsdp1_context(model, full, _multi_process(args)), None
    return contextlib.nullcontext(), _fsdp2_options(full, _multi_process(args))


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


def save_fsdp_weights(trainer: CheckpointIOOwner, output_dir: str, in_checkpoint: bool = False) -> None:
    """`save_model` under FSDP: the full weights gathered onto rank 0 (one tensor at a time, never the whole model
    on every rank) go through the usual `_save` (model.safetensors, config, training_args.bin). In a checkpoint a
    sharded run keeps its shards (`pytorch_model_fsdp_0/`) and writes only the model's config beside them, so the
    folder consolidates on its own (docs/divergences.md: the reference writes no weights after a sharded run)."""
    if saves_full_state(trainer.plan) or not in_checkpoint:
        trainer._save(output_dir, state_dict=gather_full_state_dict(trainer.model_wrapped))
    elif trainer.args.should_save:
        save_model_config(trainer.model, output_dir)


def save_model_config(model: nn.Module, output_dir: str) -> None:
    """The model's `config.json` (and `generation_config.json`) when it has a transformers config."""
    for attribute in ("config", "generation_config"):
        config = getattr(model, attribute, None)
        if callable(getattr(config, "save_pretrained", None)):
            os.makedirs(output_dir, exist_ok=True)
            config.save_pretrained(output_dir)


def save_fsdp_model(model: nn.Module, output_dir: str, *, full: bool, args: TrainingArguments) -> None:
    """The wrapped `model`'s `pytorch_model_fsdp.bin` (`full`: rank 0) or `pytorch_model_fsdp_0/` distributed
    checkpoint."""
    context, options = _state_dict_mode(model, full, args)
    os.makedirs(output_dir, exist_ok=True)
    with context:
        _write_state(output_dir, FSDP_MODEL_NAME, "model", _model_state(model, options), full, args.process_index)


def _write_state(output_dir: str, name: str, key: str, state: dict[str, Any], full: bool, process_index: int) -> None:
    """Rank 0 writes the full state to `<name>.bin`; or every rank its shard, under `key`, to the distributed
    checkpoint `<name>_0/` (accelerate's file names)."""
    if full:
        if process_index == 0:
            torch.save(state, os.path.join(output_dir, f"{name}.bin"))
        return
    import torch.distributed.checkpoint as dcp

    folder = os.path.join(output_dir, f"{name}_0")
    os.makedirs(folder, exist_ok=True)
    dcp.save({key: state}, storage_writer=dcp.FileSystemWriter(folder))


def _optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, options: Any) -> dict[str, Any]:
    if options is None:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return FSDP.optim_state_dict(model, optimizer)
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=options)


def save_fsdp_optimizer(
    model: nn.Module, optimizer: Any, output_dir: str, *, full: bool, args: TrainingArguments
) -> None:
    """The optimizer of the wrapped `model`: `optimizer.bin` (`full`: rank 0) or the `optimizer_0/` distributed
    checkpoint."""
    context, options = _state_dict_mode(model, full, args)
    with context:
        state = _optimizer_state(model, plain_optimizer(optimizer), options)
        _write_state(output_dir, FSDP_OPTIMIZER_NAME, "optimizer", state, full, args.process_index)


# ---- loading -----------------------------------------------------------------------------------------------


def _reads_sharded(input_dir: str) -> bool:
    """Whether a load from `input_dir` goes through its distributed checkpoint (a sharded FSDP run wrote it) or
    through full states (FSDP's full files, or the plain files of one process, DDP or tensor parallelism)."""
    return sharded_model_folder(input_dir) is not None


def load_fsdp_model(model: nn.Module, input_dir: str, args: TrainingArguments) -> Any:
    """Load a checkpoint's weights into the wrapped model, whatever layout wrote them (accelerate's
    `load_fsdp_model` for its own files): `pytorch_model_fsdp_0/` resharded by `torch.distributed.checkpoint`,
    else the full weights (`pytorch_model_fsdp.bin`, or `model.safetensors` of a run without FSDP) handed to FSDP
    as a full state dict, into the wrapped `model`. The reference resumes and loads the best model this way under
    FSDP."""
    sharded = _reads_sharded(input_dir)
    context, options = _state_dict_mode(model, not sharded, args)
    strict = True
    barrier()
    with context:
        if not sharded:
            fsdp_file = full_fsdp_model_file(input_dir)
            if fsdp_file is None and not has_plain_weights(input_dir):
                raise ValueError(
                    f"{input_dir} holds no model weights ({FSDP_MODEL_NAME}.bin, {FSDP_MODEL_NAME}_0/ or "
                    "model.safetensors); resume from a complete checkpoint"
                )
            # FSDP2 broadcasts from rank 0; FSDP1 loads the whole dict on every rank.
            reads = options is None or args.process_index == 0 or not _multi_process(args)
            state = {}
            if reads:
                state = safe_torch_load(fsdp_file) if fsdp_file else read_full_model_state(input_dir)
            # model.safetensors leaves out tied weights: loaded non-strict, as the reference loads it.
            strict = fsdp_file is not None
            if options is not None:
                options = dataclasses.replace(options, strict=strict)
        else:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

            holder = {"model": _model_state(model, options)}
            folder = sharded_model_folder(input_dir)
            check_distributed_checkpoint(folder)
            dcp.load(
                holder,
                storage_reader=dcp.FileSystemReader(folder),
                planner=safe_load_planner(DefaultLoadPlanner),
            )
            state = holder["model"]
        if options is None:
            result = model.load_state_dict(state, strict=strict)
        else:
            from torch.distributed.checkpoint.state_dict import set_model_state_dict

            result = set_model_state_dict(model, state, options=options)
    barrier()
    return result


def load_fsdp_optimizer(
    model: nn.Module, optimizer: Any, input_dir: str, args: TrainingArguments, *, named_by: nn.Module
) -> None:
    """Load a checkpoint's optimizer state into the optimizer of the wrapped `model`, whatever layout wrote it
    (accelerate's `load_fsdp_optimizer` for its own files): `optimizer_0/` resharded, else the full state
    (`optimizer.bin`, or `optimizer.pt` keyed by name through the parameter order of `named_by`, the trainer's
    model) handed to FSDP as a full state dict."""
    sharded = sharded_optimizer_folder(input_dir) is not None
    optimizer = plain_optimizer(optimizer)
    context, options = _state_dict_mode(model, not sharded, args)
    barrier()
    with context:
        if not sharded:
            state = None
            if args.process_index == 0:  # rank 0 reads; FSDP hands the state to the other ranks
                state = read_full_optimizer_state(input_dir)
                if not is_keyed_by_name(state):  # optimizer.pt of a run without FSDP: named through our order
                    state = optimizer_state_by_name(state, optimizer_parameter_names(named_by, optimizer))
            if options is not None and state is None:
                state = {}
        else:
            state = _read_sharded_optimizer(model, optimizer, options, sharded_optimizer_folder(input_dir))
        if options is None:
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            optimizer.load_state_dict(FSDP.optim_state_dict_to_load(model, optimizer, state))
        else:
            from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

            set_optimizer_state_dict(model, optimizer, state, options=options)
    barrier()


def _read_sharded_optimizer(
    model: nn.Module, optimizer: torch.optim.Optimizer, options: Any, folder: str
) -> dict[str, Any]:
    """The `optimizer_0/` distributed checkpoint, shaped after this run's shards.

    FSDP2's template (`get_optimizer_state_dict`) creates the optimizer's state first, so every saved entry has a
    slot to load into; FSDP1's `optim_state_dict` would be empty before the first step, so its layout is read from
    the checkpoint's metadata instead (`load_sharded_optimizer_state_dict`, as Lightning's FSDP strategy does).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    check_distributed_checkpoint(folder)  # FSDP1's reader below still reads parameter groups unrestricted
    reader = dcp.FileSystemReader(folder)
    if options is not None:
        holder = {"optimizer": _optimizer_state(model, optimizer, options)}
        dcp.load(holder, storage_reader=reader, planner=safe_load_planner(DefaultLoadPlanner))
        return holder["optimizer"]
    from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict

    model_state = model.state_dict()
    return load_sharded_optimizer_state_dict(model_state, optimizer_key="optimizer", storage_reader=reader)[
        "optimizer"
    ]


class FSDPCheckpointIO(StrategyCheckpointIO):
    """accelerate's FSDP files: `pytorch_model_fsdp.bin` / `optimizer.bin` (full) or the `pytorch_model_fsdp_0/` /
    `optimizer_0/` distributed checkpoints (sharded); every method that writes or loads them runs on all ranks."""

    loads_weights_before_training = False  # into the wrapped model, once the strategy has built it
    weights_files_required = False
    supports_background_writes = False

    def check_resumable(self, checkpoint: str) -> None:
        """Any layout we write resumes under FSDP (its sharded or full files, or a run's without FSDP)."""
        refuse_deepspeed_checkpoint(checkpoint)
        if not has_model_state(checkpoint):
            raise ValueError(f"Can't find a valid checkpoint at {checkpoint}")

    def optimizer_files(self, checkpoint: str) -> list[str]:
        # Every optimizer layout is read at train start, once FSDP holds the optimizer; the scheduler is listed
        # only alongside it.
        if optimizer_file(checkpoint) is not None and os.path.isfile(os.path.join(checkpoint, SCHEDULER_NAME)):
            return [SCHEDULER_NAME]
        return []

    def load_weights(self, trainer: CheckpointIOOwner, checkpoint: str, model: Any) -> None:
        load_fsdp_model(trainer.model_wrapped, checkpoint, trainer.args)

    def load_best_weights(self, trainer: CheckpointIOOwner, best_dir: str) -> None:
        load_fsdp_model(trainer.model_wrapped, best_dir, trainer.args)

    def load_optimizer_and_scheduler(self, trainer: CheckpointIOOwner, files: Any) -> None:
        """Once the model is wrapped and the optimizer built: the model files (through the trainer's
        `_load_from_checkpoint`, a subclass's override included), then the optimizer and the scheduler when the
        checkpoint has both (`files` lists `scheduler.pt` only when the FSDP optimizer files are there too)."""
        trainer._load_from_checkpoint(files.checkpoint, trainer.model_wrapped)
        if SCHEDULER_NAME in files.names:
            load_fsdp_optimizer(
                trainer.model_wrapped, trainer.optimizer, files.checkpoint, trainer.args, named_by=trainer.model
            )
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*save or load the state of the optimizer.*")
                trainer.lr_scheduler.load_state_dict(files.take(SCHEDULER_NAME))

    def save_optimizer_and_scheduler(self, trainer: CheckpointIOOwner, output_dir: str, reach: Any) -> None:
        """The model and optimizer files, named as accelerate names them; then `scheduler.pt`."""
        full, model = saves_full_state(trainer.plan), trainer.model_wrapped
        save_fsdp_model(model, output_dir, full=full, args=trainer.args)
        save_fsdp_optimizer(model, trainer.optimizer, output_dir, full=full, args=trainer.args)
        if trainer.args.should_save:
            self._save_scheduler(trainer.lr_scheduler, output_dir, reach)

    def save_model(self, trainer: CheckpointIOOwner, output_dir: str, in_checkpoint: bool = False) -> None:
        save_fsdp_weights(trainer, output_dir, in_checkpoint)
