"""End a worker of a multi-process test cleanly, whichever library created its process group.

A gloo group's C++ worker threads can still hold work objects at interpreter finalization; destroying them
then aborts a finished process ("terminate called without an active exception", pytorch/pytorch#190489,
#179291), even after `destroy_process_group()`, and more often on a loaded machine. A worker's results are
written before it ends, so it skips finalization: it waits for every rank, destroys the group, runs the
`atexit` handlers (a self-launched rank 0 waits there for its children) and leaves with `os._exit`.
"""

from __future__ import annotations

import atexit
import os
import sys


def end_worker() -> None:
    """Wait for every rank, destroy the default process group, run exit handlers, exit 0 without finalization."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
