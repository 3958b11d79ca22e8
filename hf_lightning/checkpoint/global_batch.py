"""`HF_LIGHTNING_KEEP_GLOBAL_BATCH=1`: a resume on another number of processes keeps the saving run's global batch.

A job restarted after losing (or gaining) nodes runs the same script on another number of data-parallel processes,
so the same `per_device_train_batch_size` and `gradient_accumulation_steps` make another global batch, and the
resume cannot continue the data where it stopped (a warning says so, checkpoint/resume.py). With this switch set,
`gradient_accumulation_steps` is recomputed before training so that per-device batch x data-parallel processes x
accumulation equals the global batch recorded in the checkpoint, and the change is said; a global batch this run's
processes cannot divide is refused before training, naming the numbers. Without the switch nothing changes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from hf_lightning.checkpoint.files import saved_samples_per_update

logger = logging.getLogger(__name__)

KEEP_GLOBAL_BATCH_ENV = "HF_LIGHTNING_KEEP_GLOBAL_BATCH"


def keep_global_batch_requested(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the user asked for the checkpoint's global batch to be kept (`HF_LIGHTNING_KEEP_GLOBAL_BATCH=1`)."""
    return environ.get(KEEP_GLOBAL_BATCH_ENV, "0") in ("1", "true", "True")


def accumulation_keeping_global_batch(
    checkpoint: str,
    per_device_batch: int,
    data_parallel_processes: int,
    accumulation: int,
    environ: Mapping[str, str] = os.environ,
) -> int | None:
    """The `gradient_accumulation_steps` that keeps `checkpoint`'s global batch on this run's processes, when the
    switch is set and it differs from `accumulation` (None otherwise: keep the arguments as they are)."""
    if not keep_global_batch_requested(environ):
        return None
    saved = saved_samples_per_update(checkpoint)
    per_accumulation_step = per_device_batch * data_parallel_processes
    if saved is None or saved == per_accumulation_step * accumulation:
        return None
    if saved % per_accumulation_step:
        raise ValueError(
            f"{KEEP_GLOBAL_BATCH_ENV}=1, but {checkpoint} was saved with a global batch of {saved} samples per "
            f"update, which per_device_train_batch_size={per_device_batch} x {data_parallel_processes} data-parallel "
            f"process(es) x gradient_accumulation_steps cannot make. Choose per_device_train_batch_size so that it "
            f"times the data-parallel processes divides {saved}, or unset {KEEP_GLOBAL_BATCH_ENV} to train with "
            "another global batch."
        )
    return saved // per_accumulation_step
