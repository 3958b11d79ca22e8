"""Seeding exactly as the reference does, so dropout and sampler streams match (R3.3, R7.8).

Lightning's `seed_everything` is deliberately not used: it would add draws the reference does not make.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from hf_lightning.core.heavy_imports import import_lightning

_DETERMINISM_ENV = {
    "CUDA_LAUNCH_BLOCKING": "1",
    "CUBLAS_WORKSPACE_CONFIG": ":16:8",
    "ASCEND_LAUNCH_BLOCKING": "1",
    "HCCL_DETERMINISTIC": "1",
    "FLASH_ATTENTION_DETERMINISTIC": "1",
}


def set_seed(seed: int, deterministic: bool = False) -> None:
    """Seed Python, NumPy, torch CPU and every CUDA device, like transformers' `set_seed`."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def enable_full_determinism(seed: int, warn_only: bool = False) -> None:
    """Seed, set the reference's five determinism environment variables and deterministic algorithms."""
    set_seed(seed)
    os.environ.update(_DETERMINISM_ENV)
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def _import_engine() -> None:
    """Import Lightning now, so the modules it pulls in do their import-time draws before the seeding.

    rich (imported by Lightning when installed) draws `random.getrandbits(24)` at import; imported first after
    the seeding, it would shift Python's `random` stream from the reference's for every collator using it.
    The facade's first use of Lightning, so it loads here without the collector's full passes.
    """
    import_lightning()


def seed_from_args(args) -> None:
    """`full_determinism` chooses between the two seeding modes, as the reference's constructor does."""
    _import_engine()
    if args.full_determinism:
        enable_full_determinism(args.seed)
    else:
        set_seed(args.seed)
