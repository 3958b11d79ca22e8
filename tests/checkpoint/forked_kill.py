"""Run a training in a forked child that SIGKILLs itself at a kill point, and wait for it with a bound."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import pytest
import torch


def run_in_killed_child(train: Callable[[], None], *, timeout_s: float, what: str) -> int:
    """Call `train()` in a forked child (which is expected to kill itself) and return its wait status; a child
    still running after `timeout_s` is killed and fails the test instead of blocking the suite."""
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            # The parent's OpenMP thread team does not exist in a forked child: a parallel region would wait for
            # it forever. One thread gives the same results on these tiny tensors.
            torch.set_num_threads(1)
            train()
        finally:
            os._exit(0)  # reached only when the kill point was not
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid:
            return status
        time.sleep(0.01)
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    pytest.fail(f"the child killed at {what} hung for {timeout_s} s")
