"""End a worker of a multi-process test cleanly, whichever library created its process group.

A gloo group left for the C++ destructors at interpreter exit can abort the process ("terminate called
without an active exception") after all its work is done; transformers (accelerate) leaves its group to them.
"""

from __future__ import annotations


def destroy_process_group() -> None:
    """Wait for every rank, then destroy the default process group if one exists."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
