"""What the facade's Hub pushes use (trainer/hub_methods.py): what a push leaves out, the running pushes, errors.

Ours on top of the reference's ignore patterns: the scratch folders of our atomic saves, our checkpoint marker and
the telemetry's local report are never uploaded; a token the Hub refuses is reported with the fix.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from concurrent import futures

from hf_lightning.core.checkpoint_files import (
    ADAPTER_SAFE_WEIGHTS_NAME,
    ADAPTER_WEIGHTS_NAME,
    COMPLETE_MARKER_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)

__all__ = ["PushInProgress", "hub_progress_bars_suppressed", "modeling_files", "push_ignore_patterns", "token_error"]

CONFIG_NAME = "config.json"
GENERATION_CONFIG_NAME = "generation_config.json"
ADAPTER_CONFIG_NAME = "adapter_config.json"
# The reference's patterns for `output_dir`: private files and the local checkpoint folders.
_REFERENCE_IGNORE_PATTERNS = ("_*", "checkpoint-*")
# Ours: the scratch folders of an atomic save (`.checkpoint-N.tmp-*`, `.old-*`, `.deleting-*`) and the temporary
# file `save_state()` renames into place, which a background push overlapping a save would otherwise see.
_SCRATCH_PATTERNS = (".checkpoint-*", "*.tmp-*")
# The telemetry's summary of the run (engine/telemetry/meter.py `SUMMARY_NAME`): a local report, so the Hub's tree
# stays the reference's.
_LOCAL_REPORTS = ("run_performance.json",)


def push_ignore_patterns(checkpoint: bool) -> list[str]:
    """What a push leaves out: of `output_dir` (the reference's patterns and our scratch), or of a checkpoint."""
    if checkpoint:
        return [COMPLETE_MARKER_NAME, *_SCRATCH_PATTERNS]
    return [*_REFERENCE_IGNORE_PATTERNS, *_SCRATCH_PATTERNS, *_LOCAL_REPORTS]


class PushInProgress:
    """The background push jobs of one save (the reference's name and methods)."""

    def __init__(self, jobs: list[futures.Future] | None = None) -> None:
        self.jobs = [] if jobs is None else jobs

    def is_done(self) -> bool:
        """Whether every job has finished (successfully or not)."""
        return all(job.done() for job in self.jobs)

    def wait_until_done(self) -> None:
        """Block until every job has finished."""
        futures.wait(self.jobs)

    def cancel(self) -> None:
        """Cancel the jobs not started yet and forget the finished ones."""
        self.jobs = [job for job in self.jobs if not (job.cancel() or job.done())]


@contextlib.contextmanager
def hub_progress_bars_suppressed(push_to_hub: bool) -> Iterator[None]:
    """huggingface_hub's progress bars off during a pushing `train()`, as the reference does."""
    if not push_to_hub:
        yield
        return
    import huggingface_hub.utils as hub_utils

    hub_utils.disable_progress_bars()
    try:
        yield
    finally:
        hub_utils.enable_progress_bars()


def token_error(endpoint: str, error: BaseException) -> ValueError:
    """The error a push raises when the Hub refused the token: the endpoint, the HTTP status and the fix."""
    reason = getattr(getattr(error, "response", None), "status_code", None)
    detail = f"HTTP {reason}" if reason is not None else type(error).__name__
    return ValueError(
        f"push_to_hub=True: the Hub at {endpoint} did not accept the token ({detail}). Set `hub_token` (or the "
        "HF_TOKEN environment variable, or log in with `hf auth login`) to a token with write access, or set "
        "push_to_hub=False."
    )


def modeling_files(checkpoint_folder: str) -> list[str]:
    """The files of a checkpoint that make the model: config, weights (and their shards), adapter files."""
    names = [CONFIG_NAME, GENERATION_CONFIG_NAME, WEIGHTS_NAME, SAFE_WEIGHTS_NAME]
    for index_name in (WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_INDEX_NAME):
        index_path = os.path.join(checkpoint_folder, index_name)
        if os.path.isfile(index_path):
            names.append(index_name)
            with open(index_path, encoding="utf-8") as f:
                names.extend(sorted(set(json.load(f)["weight_map"].values())))
    names.extend([ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, ADAPTER_SAFE_WEIGHTS_NAME])
    return names
