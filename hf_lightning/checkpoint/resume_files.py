"""The files a resume reads from a chosen checkpoint, and the states applied straight from them.

`ResumeFiles` holds the torch files read at `train()` entry (so a bad one is refused before training); the
reference-named load hooks (`_load_scaler`, `_load_rng_state`, the strategy's optimizer load) take from it. Beside
the `Resumer` (checkpoint/resume.py) and below the facade's hooks, so a resume goes down: Resumer -> hook -> here.
"""

from __future__ import annotations

import json
import logging
import os
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from hf_lightning.checkpoint.data_resume import SavedDataPosition
from hf_lightning.core.checkpoint_files import SCALER_NAME, rng_state_file_name, safe_torch_load
from hf_lightning.core.enums import enum_value

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from hf_lightning.args.training_args import TrainingArguments
    from hf_lightning.strategies.checkpoint_io import StrategyCheckpointIO

logger = logging.getLogger(__name__)


@dataclass
class ResumeFiles:
    """A chosen checkpoint and the torch files read from it at `train()` entry (consumed when applied)."""

    checkpoint: str
    names: list[str] = field(default_factory=list)
    loaded: dict[str, Any] = field(default_factory=dict)
    data_position: SavedDataPosition | None = None  # where the train data stood (checkpoint/data_resume.py)

    def take(self, name: str, map_location: Any = "cpu") -> Any:
        """The file's content: the copy read at entry the first time, a fresh read after that.

        A second use happens when `auto_find_batch_size` restarts the run; the first copy may by then share
        tensors with the optimizer that trained.
        """
        if name in self.loaded:
            return self.loaded.pop(name)
        path = os.path.join(self.checkpoint, name)
        return safe_torch_load(path, numpy_allowed=name.startswith("rng_state"), map_location=map_location)


def warn_on_version_mismatch(checkpoint: str) -> None:
    config_file = os.path.join(checkpoint, "config.json")
    if not os.path.isfile(config_file):
        return
    try:
        from importlib.metadata import PackageNotFoundError, version

        installed = version("transformers")
    except PackageNotFoundError:
        return
    with open(config_file, encoding="utf-8") as f:
        saved = json.load(f).get("transformers_version")
    if saved is not None and saved != installed:
        logger.warning(
            f"You are resuming training from a checkpoint trained with {saved} of Transformers but your current "
            f"version is {installed}. This is not recommended and could yield to errors or unwanted behaviors."
        )


def saved_process_count(checkpoint: str) -> int:
    """How many processes wrote `checkpoint`'s RNG files: one per process (`rng_state_<rank>.pth`), or
    `rng_state.pth` for one process; 0 when it holds none."""
    ranks = [
        int(name[len("rng_state_") : -len(".pth")])
        for name in os.listdir(checkpoint)
        if name.startswith("rng_state_") and name.endswith(".pth") and name[len("rng_state_") : -4].isdigit()
    ]
    if ranks:
        return max(ranks) + 1
    return 1 if os.path.isfile(os.path.join(checkpoint, rng_state_file_name(1, 0))) else 0


def rng_file_to_restore(checkpoint: str, world_size: int, process_index: int) -> str | None:
    """This process's RNG file in `checkpoint`: the reference's (`rng_state_<rank>.pth`, `rng_state.pth` for one
    process) when the checkpoint was saved by as many processes; else process `rank % saved` of the saving run's
    (docs/divergences.md, "Resuming on another number of processes"); None when it holds none."""
    saved = saved_process_count(checkpoint)
    if saved == 0:
        return None
    if saved == world_size:
        return rng_state_file_name(world_size, process_index)
    return rng_state_file_name(saved, process_index % saved)


def torch_files_to_restore(args: Any, checkpoint: str, optimizer_files: list[str]) -> list[str]:
    """The strategy's optimizer and scheduler files, the scaler and this process's RNG file, as far as they exist."""
    names = list(optimizer_files)
    if os.path.isfile(os.path.join(checkpoint, SCALER_NAME)):
        names.append(SCALER_NAME)
    rng_name = rng_file_to_restore(checkpoint, args.world_size, args.process_index)
    if rng_name is not None and os.path.isfile(os.path.join(checkpoint, rng_name)):
        names.append(rng_name)
    elif args.world_size > 1:
        logger.info(
            f"Didn't find an RNG file for process {args.process_index}, if you are resuming a training that "
            "wasn't launched in a distributed fashion, reproducibility is not guaranteed."
        )
    else:
        logger.info(
            "Didn't find an RNG file, if you are resuming a training that was launched in a distributed "
            "fashion, reproducibility is not guaranteed."
        )
    return names


class ResumeFilesSource(Protocol):
    """The trainer as the load hooks' file reading sees it: the arguments, the running `train()`'s files, the
    strategy's file layout and (for the scaler) Lightning's precision plugin."""

    args: TrainingArguments
    lightning_trainer: pl.Trainer | None
    _training_run: Any  # engine.training_run.TrainingRun while `train()` runs (its Resumer's files), None outside

    @property
    def _checkpoint_io(self) -> StrategyCheckpointIO: ...


def resume_files(trainer: ResumeFilesSource, checkpoint: str) -> ResumeFiles:
    """The files of `checkpoint` a resume reads: those read at the running `train()`'s entry when it resumes from
    `checkpoint`, else read now (a subclass or a script calling the reference's loading methods itself)."""
    run = trainer._training_run
    files = run.resume.files if run is not None else None
    if files is not None and files.checkpoint == checkpoint:
        return files
    io = trainer._checkpoint_io
    names = torch_files_to_restore(trainer.args, checkpoint, io.optimizer_files(checkpoint))
    return ResumeFiles(checkpoint, names=names)


def load_scaler_state(trainer: ResumeFilesSource, checkpoint: str) -> None:
    """`scaler.pt` into the fp16 grad scaler of Lightning's precision plugin; warned about without one."""
    files = resume_files(trainer, checkpoint)
    if SCALER_NAME not in files.names:
        return
    scaler = getattr(trainer.lightning_trainer.precision_plugin, "scaler", None)
    if scaler is None:
        logger.warning(
            f"{files.checkpoint} holds an fp16 grad-scaler state ({SCALER_NAME}) but this run has no grad "
            "scaler (fp16=False); the scaler state is not restored."
        )
    else:
        scaler.load_state_dict(files.take(SCALER_NAME))


def load_rng_state(trainer: ResumeFilesSource, checkpoint: str) -> None:
    """The reference's `_load_rng_state`: Python, NumPy, torch CPU and (when present) CUDA generators from this
    process's RNG file of `checkpoint` (nothing when it has none)."""
    files = resume_files(trainer, checkpoint)
    names = [name for name in files.names if name.startswith("rng_state")]
    if not names:
        return
    # Kept, not taken: an auto_find_batch_size restart restores it again.
    states = files.loaded.get(names[0]) or files.take(names[0])
    import numpy as np
    import torch

    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["cpu"])
    if torch.cuda.is_available():
        try:
            if enum_value(trainer.args.parallel_mode) == "distributed":
                torch.cuda.random.set_rng_state_all(states["cuda"])
            else:
                torch.cuda.random.set_rng_state(states["cuda"])
        except Exception as error:
            logger.error(
                "Didn't manage to set back the RNG states of the CUDA because of the following error:\n"
                f" {error}\nThis won't yield the same results as if the training had not been interrupted."
            )
