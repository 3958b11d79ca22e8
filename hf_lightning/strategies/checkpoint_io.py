"""How a strategy writes and reads the parts of a checkpoint that depend on how it holds the model.

`checkpoint/` (the save protocol, rotation, best model, resume) never asks which strategy runs: it calls the
trainer's `StrategyCheckpointIO`, chosen once from the plan (`checkpoint_io_for`), the way Lightning's strategies
decide their own checkpoint layout (`Strategy.save_checkpoint` / `load_checkpoint`). This module is the base: one
process's model or DDP replicas, the reference's plain files (`model.safetensors`, `optimizer.pt`, `scheduler.pt`).
FSDP (`strategies/fsdp/checkpoint.py`), tensor parallelism (`strategies/tensor_parallel/checkpoint_io.py`) and
DeepSpeed (`strategies/deepspeed/checkpoint_io.py`) override what they hold differently.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

import torch

from hf_lightning.core.checkpoint_files import (
    ADAPTER_SAFE_WEIGHTS_NAME,
    ADAPTER_WEIGHTS_NAME,
    OPTIMIZER_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    SCHEDULER_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    read_model_state_dict,
)
from hf_lightning.data.model_inputs import is_peft_model
from hf_lightning.strategies.portable_state import (
    has_model_state,
    is_keyed_by_name,
    optimizer_file,
    optimizer_parameter_names,
    optimizer_state_by_index,
    read_full_model_state,
    read_full_optimizer_state,
)

logger = logging.getLogger(__name__)

WEIGHTS_FILES = (
    SAFE_WEIGHTS_NAME,
    WEIGHTS_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    WEIGHTS_INDEX_NAME,
    ADAPTER_SAFE_WEIGHTS_NAME,
    ADAPTER_WEIGHTS_NAME,
)
_ADAPTER_FILES = (ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME)


def weights_files_present(checkpoint: str) -> list[str]:
    """The model-weights files (whole, sharded index or adapter) that `checkpoint` holds."""
    return [name for name in WEIGHTS_FILES if os.path.isfile(os.path.join(checkpoint, name))]


def optimizer_map_location(args: Any) -> Any:
    """Where an optimizer state is read to: the CPU for one process (no device memory spike), each process's
    device when distributed (the reference's rule)."""
    return args.device if args.world_size > 1 and args.device.type != "cpu" else "cpu"


def _plain_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside Lightning's `LightningOptimizer` (the facade may hold either)."""
    return getattr(optimizer, "_optimizer", optimizer)


class StrategyCheckpointIO:
    """One process's model, or DDP replicas: the reference's plain checkpoint files.

    `trainer` is the facade (or the port its caller names); methods that write run on the processes allowed to
    save unless their docstring says "all ranks" (they then hold collectives).
    """

    # The model weights load at `train()` entry, before the optimizer exists (FSDP and DeepSpeed load into the wrapped
    # model or the engine once the strategy has built them).
    loads_weights_before_training = True
    # A checkpoint's completeness includes its model-weights files (a sharded layout keeps them elsewhere).
    weights_files_required = True
    # The copy-then-write of `AsyncCheckpointIO` (checkpoint/async_writes.py) can take this strategy's state.
    supports_background_writes = True

    # ---- resuming ---------------------------------------------------------------------------------------------

    def check_resumable(self, trainer: Any, checkpoint: str) -> None:
        """Before anything is read: refuse a folder this strategy cannot resume from (ValueError naming it). Any
        layout we write resumes here (strategies/portable_state.py), a PEFT run's adapter-only folder too (loaded into
        the model's active adapter by `load_weights`); DeepSpeed's engine folders do not."""
        refuse_deepspeed_checkpoint(checkpoint)
        if not (weights_files_present(checkpoint) or has_model_state(checkpoint)):
            raise ValueError(f"Can't find a valid checkpoint at {checkpoint}")

    def optimizer_files(self, checkpoint: str) -> list[str]:
        """The optimizer and scheduler files a resume reads at `train()` entry: both or neither. FSDP's optimizer
        files are read when the optimizer exists (`load_optimizer_and_scheduler`); only `scheduler.pt` is listed."""
        if not os.path.isfile(os.path.join(checkpoint, SCHEDULER_NAME)):
            return []
        if os.path.isfile(os.path.join(checkpoint, OPTIMIZER_NAME)):
            return [OPTIMIZER_NAME, SCHEDULER_NAME]
        if optimizer_file(checkpoint) is not None:
            return [SCHEDULER_NAME]
        return []

    def load_weights(self, trainer: Any, checkpoint: str, model: Any) -> None:
        """The weights of `checkpoint` into `model`, non-strict, from the CPU (the reference's `_load_from_checkpoint`);
        an adapter-only checkpoint into a PEFT model's active adapter."""
        present = weights_files_present(checkpoint)
        if not present and has_model_state(checkpoint):  # FSDP's files, full or sharded, merged on the CPU
            present = []
        elif not present:
            raise ValueError(f"Can't find a valid checkpoint at {checkpoint}")
        whole_file = SAFE_WEIGHTS_NAME in present or WEIGHTS_NAME in present
        if present and not whole_file and set(present) <= set(_ADAPTER_FILES):
            if not (callable(getattr(model, "load_adapter", None)) and hasattr(model, "active_adapters")):
                raise ValueError(
                    f"{checkpoint} holds only adapter weights ({', '.join(present)}), but the model is not a PEFT "
                    "model; resume with the PEFT-wrapped model that wrote it."
                )
            active_adapters = model.active_adapters
            if len(active_adapters) > 1:
                logger.warning("Multiple active adapters detected will only consider the first adapter")
            model.load_adapter(checkpoint, active_adapters[0], is_trainable=True)
            return
        # The plain files read straight; FSDP's full or sharded files merged on the CPU (strategies/portable_state.py).
        state_dict = read_model_state_dict(checkpoint) if present else read_full_model_state(checkpoint)
        load_result = self._load_state_dict(model, state_dict)
        del state_dict
        trainer._issue_warnings_after_load(load_result)

    def load_best_weights(self, trainer: Any, best_dir: str) -> None:
        """`load_best_model_at_end`: the best checkpoint's weights into `trainer.model`. Missing weights only warn,
        as in the reference."""
        model = trainer.model
        if is_peft_model(model) and any(os.path.exists(os.path.join(best_dir, name)) for name in _ADAPTER_FILES):
            model.load_adapter(best_dir, model.active_adapters[0])
            return
        state_dict = read_full_model_state(best_dir)
        if state_dict is None:
            logger.warning(
                f"Could not locate the best model at {os.path.join(best_dir, WEIGHTS_NAME)}, if you are running a "
                "distributed training on multiple nodes, you should activate `--save_on_each_node`."
            )
            return
        trainer._issue_warnings_after_load(self._load_state_dict(model, state_dict))

    def _load_state_dict(self, model: Any, state_dict: dict) -> Any:
        return model.load_state_dict(state_dict, False)

    def load_optimizer_and_scheduler(self, trainer: Any, files: Any) -> None:
        """Once Lightning has set them up: the optimizer and scheduler states read at entry (`files` is resume's
        `ResumeFiles`; nothing when the checkpoint has none)."""
        if OPTIMIZER_NAME in files.names:
            state = files.take(OPTIMIZER_NAME, optimizer_map_location(trainer.args))
        elif SCHEDULER_NAME in files.names:  # FSDP's optimizer files: full, or merged from the shards
            state = read_full_optimizer_state(files.checkpoint)
        else:
            return
        if is_keyed_by_name(state):  # FSDP wrote it: matched through this optimizer's parameter order
            state = optimizer_state_by_index(state, optimizer_parameter_names(trainer.model, trainer.optimizer))
        self._load_optimizer_state(trainer, state)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*save or load the state of the optimizer.*")
            trainer.lr_scheduler.load_state_dict(files.take(SCHEDULER_NAME))

    def _load_optimizer_state(self, trainer: Any, state: dict[str, Any]) -> None:
        """A full, index-keyed optimizer state into the run's optimizer."""
        trainer.optimizer.load_state_dict(state)

    # ---- saving -----------------------------------------------------------------------------------------------

    def save_optimizer_and_scheduler(self, trainer: Any, output_dir: str, reach: Any) -> None:
        """`optimizer.pt` and `scheduler.pt` (their `state_dict()`); `reach(point)` marks the fault-test kill points."""
        if not trainer.args.should_save:
            return
        optimizer_state = self._optimizer_state(trainer)
        self.write_optimizer_and_scheduler(optimizer_state, scheduler_state(trainer.lr_scheduler), output_dir, reach)

    def write_optimizer_and_scheduler(
        self, optimizer_state: dict[str, Any], scheduler_state: dict[str, Any], output_dir: str, reach: Any
    ) -> None:
        """`optimizer.pt` and `scheduler.pt` from plain state dicts: a staged checkpoint's (checkpoint/staging.py)
        or the live optimizer's and scheduler's."""
        reach("optimizer")
        torch.save(optimizer_state, os.path.join(output_dir, OPTIMIZER_NAME))
        reach("scheduler")
        torch.save(scheduler_state, os.path.join(output_dir, SCHEDULER_NAME))

    def _optimizer_state(self, trainer: Any) -> dict[str, Any]:
        return trainer.optimizer.state_dict()

    def _save_scheduler(self, trainer: Any, output_dir: str, reach: Any) -> None:
        state = scheduler_state(trainer.lr_scheduler)
        reach("scheduler")
        torch.save(state, os.path.join(output_dir, SCHEDULER_NAME))

    def save_model(self, trainer: Any, output_dir: str, in_checkpoint: bool = False) -> None:
        """`save_model`'s weights: the trainer's `_save` with the model as this process holds it. All ranks.
        `in_checkpoint`: the call writes a `checkpoint-N` folder (a sharded strategy keeps its shards there)."""
        trainer._save(output_dir)


def scheduler_state(scheduler: Any) -> dict[str, Any]:
    """The scheduler's `state_dict()`, without torch's warning that the optimizer's state is not saved with it
    (the reference hides it too)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*save or load the state of the optimizer.*")
        return scheduler.state_dict()


def refuse_deepspeed_checkpoint(checkpoint: str) -> None:
    """Outside DeepSpeed: refuse a checkpoint whose optimizer state lives in DeepSpeed's engine folder (a resume
    would otherwise continue with a fresh optimizer, even where consolidated weights sit beside it)."""
    if _has_deepspeed_state(checkpoint):
        raise ValueError(
            f"{checkpoint} holds a DeepSpeed engine checkpoint (global_step*/), whose optimizer state resumes only "
            "under DeepSpeed; resume it with deepspeed=..., or convert it with DeepSpeed's universal-checkpoint "
            "tooling (ds_to_universal) first."
        )


def _has_deepspeed_state(checkpoint: str) -> bool:
    """Whether `checkpoint` holds a DeepSpeed engine folder (`global_step*`), DeepSpeed's own layout."""
    return os.path.isdir(checkpoint) and any(
        name.startswith("global_step") and os.path.isdir(os.path.join(checkpoint, name))
        for name in os.listdir(checkpoint)
    )
