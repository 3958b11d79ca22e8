"""Asynchronous checkpoint writes, opted into with Lightning's `AsyncCheckpointIO` plugin.

`lightning_trainer_overrides={"plugins": [AsyncCheckpointIO()]}` (or the YAML `trainer: plugins:` section) turns
them on. A save then blocks training only while the state is copied off the device (model and optimizer tensors
into CPU memory, scheduler, scaler, RNG and trainer state as they are at that step); one background thread
writes the files from that copy, fsyncs them, writes the completion marker, renames the folder into place and
rotates old checkpoints, the same atomic protocol and code as a synchronous save (`checkpoint/checkpointer.py`). A second
save waits for the first; `train()` waits for a pending write before it resumes and before it returns, and
re-raises a failed write there. `on_save` fires on every process at the first step boundary after the folder is
committed (checkpoint/checkpointer.py), with the trainer state of the save's step. Under DDP every rank writes its
own part (its RNG file) in its thread; the ranks then agree over a gloo group of their own that every part is
durable before the saving rank commits, and again once it has committed; the training threads agree over a second
group on the step boundary where the commit is announced.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hf_lightning.checkpoint.fault_points import reach
from hf_lightning.checkpoint.files import clean_scratch_folders
from hf_lightning.core.checkpoint_files import rng_state_file_name
from hf_lightning.strategies.distributed import is_distributed

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from hf_lightning.checkpoint.staging import StagedCheckpoint

logger = logging.getLogger(__name__)

__all__ = [
    "ASYNC_SAVE_POINTS",
    "BackgroundCheckpointWriter",
    "PendingSave",
    "check_checkpoint_plugins",
    "refuse_background_writes_without_support",
]

# Named points of an asynchronous save, besides the save points every save passes (`files.SAVE_POINTS`, which the
# background thread reaches): the copy is taken (training thread), the background write begins (writer thread), the
# training thread starts waiting for a pending write (the next save, a resume, the end of train()).
ASYNC_SAVE_POINTS = ("snapshot", "write_begin", "wait_pending")

_PLUGINS_FIX = (
    "lightning_trainer_overrides['plugins'] accepts only Lightning's AsyncCheckpointIO "
    "(lightning.pytorch.plugins.io.AsyncCheckpointIO) for background checkpoint writes, and on Ray Train Ray's "
    "RayLightningEnvironment (ray.train.lightning.RayLightningEnvironment); precision comes from "
    "TrainingArguments.bf16 / fp16 and the strategy from ddp_backend / fsdp / deepspeed"
)


def _async_checkpoint_io_class() -> type:
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    return AsyncCheckpointIO


def _is_async_plugin_config(entry: Mapping) -> bool:
    """A YAML `{class_path: ...}` entry naming `AsyncCheckpointIO` or a subclass (checked before instantiation)."""
    import importlib

    class_path = entry.get("class_path")
    if not isinstance(class_path, str):
        return False
    module_name, _, class_name = class_path.rpartition(".")
    if not module_name:
        module_name = "lightning.pytorch.plugins.io"
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(cls, type) and issubclass(cls, _async_checkpoint_io_class())


def check_checkpoint_plugins(plugins: Any) -> list[Any]:
    """`plugins` as a list after checking each entry is an `AsyncCheckpointIO` (or a YAML entry naming one)."""
    entries = list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    async_io = _async_checkpoint_io_class()
    for entry in entries:
        if isinstance(entry, async_io):
            continue
        if isinstance(entry, Mapping) and _is_async_plugin_config(entry):
            continue
        raise ValueError(f"lightning.Trainer override 'plugins' got {entry!r}: {_PLUGINS_FIX}.")
    return entries


def async_writes_enabled(lightning_trainer: pl.Trainer) -> bool:
    """Whether the Lightning trainer's checkpoint IO is an `AsyncCheckpointIO` (the opt-in)."""
    return isinstance(lightning_trainer.strategy.checkpoint_io, _async_checkpoint_io_class())


def refuse_background_writes_without_support(checkpoint_io: Any) -> None:
    """ValueError when the strategy's checkpoint I/O cannot take a copied state (it gathers across ranks)."""
    if not checkpoint_io.supports_background_writes:
        raise ValueError(
            "AsyncCheckpointIO in lightning_trainer_overrides['plugins'] supports single-process and DDP "
            "runs; DeepSpeed, FSDP and tensor-parallel checkpoints gather across ranks while saving. Remove the plugin."
        )


# ---- the copy off the device ---------------------------------------------------------------------------------


def copy_state(value: Any, memo: dict | None = None) -> Any:
    """A point-in-time CPU copy of a (nested) state dict: tensors copied, tensors sharing storage still share."""
    import torch

    memo = {} if memo is None else memo
    if isinstance(value, torch.Tensor):
        return _copy_tensor(value, memo)
    if isinstance(value, dict):
        copied = type(value)() if type(value) is not dict else {}
        for key, item in value.items():
            copied[key] = copy_state(item, memo)
        metadata = getattr(value, "_metadata", None)
        if metadata is not None:
            copied._metadata = copy.deepcopy(metadata)
        return copied
    if isinstance(value, list):
        return [copy_state(item, memo) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(copy_state(item, memo) for item in value)
    return copy.deepcopy(value)


def _copy_tensor(tensor: Any, memo: dict) -> Any:
    import torch

    tensor = tensor.detach()
    try:
        storage = tensor.untyped_storage()
        key = (tensor.device, storage.data_ptr(), storage.nbytes())
        if key not in memo:
            memo[key] = storage.clone() if tensor.device.type == "cpu" else storage.cpu()
        copied = torch.empty(0, dtype=tensor.dtype)
        return copied.set_(memo[key], tensor.storage_offset(), tensor.size(), tensor.stride())
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, quantised or wrapper tensors
        return tensor.to("cpu", copy=True)


# ---- the background writer -------------------------------------------------------------------------------------


class StagedWriter(Protocol):
    """What the background thread runs of a save's protocol (checkpoint/checkpointer.py's `Checkpointer`)."""

    def write_files(self, staged: StagedCheckpoint, temporary_dir: str, rng_dir: str | None = None) -> None: ...
    def commit(self, staged: StagedCheckpoint, temporary_dir: str, final_dir: str, token: str) -> None: ...
    def rotate_after_save(self, staged: StagedCheckpoint, run_dir: str, final_dir: str, token: str) -> None: ...


@dataclass(frozen=True)
class PendingSave:
    """Where one save writes and commits, decided on the training thread."""

    run_dir: str
    final_dir: str
    temporary_dir: str
    token: str
    previous_best: str | None


class BackgroundCheckpointWriter:
    """One background thread writing one checkpoint at a time; `wait()` joins it and re-raises its failure."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._pending: tuple[Any, PendingSave] | None = None
        self._group: Any = None
        self._announce_group: Any = None  # the training threads' own, for `all_finished`
        self._finished = threading.Event()

    @property
    def pending(self) -> bool:
        """Whether a write was started and not yet waited for."""
        return self._thread is not None

    def submit(self, staged: StagedCheckpoint, save: PendingSave, checkpointer: StagedWriter, live_state: Any) -> None:
        """Write `staged` (checkpoint/staging.py, copied off the device on the training thread) in the background
        with `checkpointer`'s protocol (checkpoint/checkpointer.py), after the previous write. `live_state`: the
        trainer state whose best checkpoint a failed write puts back. All ranks."""
        self.wait()
        group = self._rank_group()
        reach("snapshot")
        self._pending = (live_state, save)
        self._finished.clear()
        self._thread = threading.Thread(
            target=self._write, args=(checkpointer, staged, save, group), name="hf_lightning-checkpoint-writer"
        )
        self._thread.start()

    def all_finished(self, collective: bool = True) -> bool:
        """Whether the pending write has finished (committed or failed) on every rank; `collective`: agreed over the
        training threads' gloo group, so every rank gets the same answer at the same step."""
        finished = self._finished.is_set()
        if collective and self._announce_group is not None:
            return _all_ranks_agree(finished, self._announce_group)
        return finished

    def wait(self) -> None:
        """Block until the pending write (if any) is committed; re-raise its failure on this thread."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        reach("wait_pending")
        thread.join()
        pending, self._pending = self._pending, None
        failure, self._failure = self._failure, None
        if failure is None:
            return
        state, save = pending
        if state.best_model_checkpoint == save.final_dir:
            state.best_model_checkpoint = save.previous_best
        raise RuntimeError(f"The background write of {save.final_dir} failed: {failure!r}") from failure

    def _rank_group(self) -> Any:
        """A gloo group of all ranks for the writers' own agreement (created once, on the training thread)."""
        if not is_distributed():
            return None
        if self._group is None:
            import torch.distributed as dist

            self._group = dist.new_group(backend="gloo")
            self._announce_group = dist.new_group(backend="gloo")
        return self._group

    def _write(self, checkpointer: StagedWriter, staged: StagedCheckpoint, save: PendingSave, group: Any) -> None:
        should_save = staged.should_save

        def write_own_part() -> None:
            checkpointer.write_files(staged, save.temporary_dir)
            if not should_save:
                own = os.path.join(save.temporary_dir, rng_state_file_name(staged.world_size, staged.process_index))
                if os.path.exists(own):
                    _fsync_file(own)

        def commit() -> None:
            if should_save:
                checkpointer.commit(staged, save.temporary_dir, save.final_dir, save.token)
                checkpointer.rotate_after_save(staged, save.run_dir, save.final_dir, save.token)

        try:
            reach("write_begin")
            _agreed(write_own_part, group, "another rank failed to write its part of the checkpoint")
            # Every rank's write finishes only once the saving rank has committed (or failed to).
            _agreed(commit, group, "the saving rank failed to commit the checkpoint")
        except BaseException as failure:  # re-raised on the training thread by wait()
            self._failure = failure
            if should_save:
                with contextlib.suppress(OSError):
                    clean_scratch_folders(save.run_dir, save.token, own_too=True)
        finally:
            self._finished.set()


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _agreed(step: Any, group: Any, failure: str) -> None:
    """Run this rank's `step`, then agree with every rank that each ran its own (a MIN all-reduce over the writers'
    group): this rank's error is raised, another rank's failure as `RuntimeError(failure)`."""
    ok = True
    try:
        step()
    except BaseException:
        ok = False
        raise
    finally:
        if group is not None:
            ok = _all_ranks_agree(ok, group) and ok
    if not ok:
        raise RuntimeError(failure)


def _all_ranks_agree(ok: bool, group: Any) -> bool:
    """True when every rank's part was written (a MIN all-reduce over the writers' gloo group)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())
