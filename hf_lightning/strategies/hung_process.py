"""When a collective times out, the process that did not arrive is named.

A process that stops making progress (stuck in its own code, a dead peer's socket) leaves the others waiting in
their next collective until `ddp_timeout`, when gloo says only "Timed out waiting 30000ms for recv". The waiting
processes then ask who is missing in a roll call through the group's store (each writes its name and waits a few
seconds for the others') and fail with one message naming the timeout, the step and the missing processes.
"""

from __future__ import annotations

import time

import torch.distributed as dist

# gloo's and NCCL's words for a collective that waited past the group's timeout.
_TIMEOUT_WORDS = ("Timed out waiting", "timed out", "Timeout", "timeout")
# How long the processes that did arrive wait for the others to answer the roll call.
ROLL_CALL_SECONDS = 10.0


def is_collective_timeout(error: BaseException) -> bool:
    """Whether `error` is a collective of a multi-process group that waited past its timeout."""
    if not isinstance(error, RuntimeError) or not (dist.is_available() and dist.is_initialized()):
        return False
    return dist.get_world_size() > 1 and any(word in str(error) for word in _TIMEOUT_WORDS)


def missing_processes(step: int) -> list[int] | None:
    """The processes that do not answer a roll call at update `step`, made through the group's store (the gloo
    connections to a missing process are closed by the timeout itself): each process that arrives writes its name,
    then waits up to `ROLL_CALL_SECONDS` for the others' names. None where the group has no store to ask."""
    store = _default_store()
    if store is None:
        return None
    world_size = dist.get_world_size()
    keys = [f"hf_lightning/roll_call/{step}/{rank}" for rank in range(world_size)]
    store.set(keys[dist.get_rank()], "here")
    deadline = time.monotonic() + ROLL_CALL_SECONDS
    while True:
        missing = [rank for rank, key in enumerate(keys) if not store.check([key])]
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(0.1)


def _default_store() -> object | None:
    try:
        return dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None


def hung_process_error(error: BaseException, *, step: int, timeout_seconds: float) -> RuntimeError:
    """The message for a collective that timed out at update `step`, naming who did not arrive."""
    missing = missing_processes(step)
    if missing:
        who = f"process {missing[0]}" if len(missing) == 1 else f"processes {', '.join(map(str, missing))}"
        named = f"{who} did not arrive (it stopped making progress: its own output and stack show where)"
    elif missing == []:
        named = "every process answered afterwards, so one of them was late by more than the timeout"
    else:
        named = "the backend cannot tell which process is missing"
    return RuntimeError(
        f"A collective waited longer than ddp_timeout={timeout_seconds:g} s during update {step + 1}: {named}. "
        f"The last complete checkpoint is untouched. Raise ddp_timeout if that process only needs longer "
        f"(a slow save or evaluation on one process), else fix what stopped it. ({error})"
    )
