"""Which live runs write checkpoints into an output folder, so no run takes another's scratch folders for leftovers.

Each process that saves checkpoints holds a small lock file while its `train()` runs: a JSON record of its host,
process id and process start time, kept outside `output_dir` (which holds exactly what the reference writes, also
while training) in a folder of this user's, one subfolder per output folder: `~/.cache/hf_lightning/run_locks/<key>/`
(`HF_LIGHTNING_RUN_LOCKS` names another; a shared home makes the locks of a cluster's runs visible to each other).
A save's scratch folders carry the saving run's process id (`.checkpoint-N.tmp-<pid>`); the tidy-up of scratch
folders (checkpoint/files.py) spares those of every run whose lock is live. A lock is live while its process runs
(same host: the process id exists with the recorded start time); a lock of another host cannot be checked from here
and counts as live.

A second run started into a folder a live run is writing is refused before training, naming the other run; the
environment variable `HF_LIGHTNING_SHARE_OUTPUT_DIR=1` lets both proceed, as the reference does. A stale lock (its
process is gone) is cleared with a warning.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

SHARE_OUTPUT_DIR_ENV = "HF_LIGHTNING_SHARE_OUTPUT_DIR"
LOCKS_DIR_ENV = "HF_LIGHTNING_RUN_LOCKS"
_LOCK_PATTERN = re.compile(r"^(.+)-(\d+)\.lock$")


@dataclass(frozen=True)
class RunRecord:
    """One run's lock: the process that writes checkpoints into the folder."""

    host: str
    pid: int
    started: float  # the process's start time (seconds since the epoch), which tells a reused process id apart
    path: str = ""

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"process {self.pid} on host {self.host}, started {started} (lock file {self.path})"

    def is_alive(self) -> bool:
        """Whether the run still runs; a run on another host is taken to (this process cannot look there)."""
        if self.host != _host():
            return True
        started = _process_start_time(self.pid)
        return started is not None and abs(started - self.started) < 1.0


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "localhost"


def _process_start_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, ValueError, OSError):
        return None


def this_process() -> RunRecord:
    """The record this process writes into its lock."""
    pid = os.getpid()
    return RunRecord(host=_host(), pid=pid, started=_process_start_time(pid) or time.time())


def locks_folder(run_dir: str) -> str:
    """Where the locks of the runs writing into `run_dir` are kept (one folder per output folder's real path)."""
    import hashlib

    root = os.environ.get(LOCKS_DIR_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "hf_lightning", "run_locks")
    key = hashlib.sha256(os.path.realpath(run_dir).encode()).hexdigest()[:24]
    return os.path.join(root, key)


def lock_path(run_dir: str, record: RunRecord) -> str:
    return os.path.join(locks_folder(run_dir), f"{record.host}-{record.pid}.lock")


def read_locks(run_dir: str) -> list[RunRecord]:
    """Every run lock in `run_dir` (an unreadable one, half written by a killed process, is skipped)."""
    records = []
    folder = locks_folder(run_dir)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in sorted(names):
        if _LOCK_PATTERN.match(name) is None:
            continue
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as f:
                content = json.load(f)
            records.append(RunRecord(str(content["host"]), int(content["pid"]), float(content["started"]), path))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return records


def live_scratch_tokens(run_dir: str) -> set[str]:
    """The scratch-folder tokens (process ids) of the runs whose lock in `run_dir` is live."""
    return {str(record.pid) for record in read_locks(run_dir) if record.is_alive()}


def claim_output_dir(run_dir: str, refuse_others: bool = True) -> str | None:
    """Note this run in `run_dir` and return its lock file (None when `run_dir` does not exist).

    Another live run's lock stops this run with a `RuntimeError` naming that run (before training), unless
    `HF_LIGHTNING_SHARE_OUTPUT_DIR=1` or not `refuse_others` (a folder first written during training): then a
    warning, and both proceed. Stale locks are removed with a warning.
    """
    if not os.path.isdir(run_dir):
        return None
    me = this_process()
    others = []
    for record in read_locks(run_dir):
        if record.host == me.host and record.pid == me.pid:
            continue  # an earlier train() of this process (a notebook's second run): ours
        if record.is_alive():
            others.append(record)
            continue
        logger.warning(
            f"output_dir {run_dir}: the run of {record.describe()} is no longer running; its lock is cleared and its scratch folders are tidied at the next save."
        )
        with contextlib.suppress(OSError):
            os.remove(record.path)
    if others:
        named = "; ".join(record.describe() for record in others)
        if refuse_others and os.environ.get(SHARE_OUTPUT_DIR_ENV, "") not in ("1", "true", "True"):
            raise RuntimeError(
                f"output_dir {run_dir} is being written by another run that is still running: {named}. Two runs in "
                "one output_dir write the same checkpoint-N folders. Give this run another output_dir, or wait for "
                f"that run to end; to run beside it anyway, as transformers.Trainer does, set {SHARE_OUTPUT_DIR_ENV}=1. "
                "If that run is gone (it ran on another machine), delete its lock file."
            )
        logger.warning(
            f"output_dir {run_dir} is also being written by {named}; both runs proceed ({SHARE_OUTPUT_DIR_ENV}=1) "
            "and each keeps its own scratch folders, but their checkpoint-N folders replace each other's."
        )
    path = lock_path(run_dir, me)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temporary = f"{path}.partial"
        with open(temporary, "w", encoding="utf-8") as f:
            record = {"host": me.host, "pid": me.pid, "started": me.started, "output_dir": os.path.realpath(run_dir)}
            json.dump(record, f)
        os.replace(temporary, path)
    except OSError as error:  # a read-only home: the run goes on, its scratch folders unprotected as before
        logger.warning(f"Could not note this run in {os.path.dirname(path)} ({error}); set {LOCKS_DIR_ENV} to a writable folder.")
        return None
    return path


def release_output_dir(lock: str | None) -> None:
    """After training: remove this run's lock (the folder then holds only what the reference writes)."""
    if lock is not None:
        with contextlib.suppress(OSError):
            os.remove(lock)
            os.rmdir(os.path.dirname(lock))  # only when no other run's lock is left there
