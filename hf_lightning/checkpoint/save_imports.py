"""`save_pretrained` without the deepspeed import it triggers when deepspeed is installed but unused.

transformers' `save_pretrained` unwraps the model with accelerate's `extract_model_from_parallel`, which
imports deepspeed (and, through it, mlflow, pandas, pyarrow ...) whenever deepspeed is installed, only
to test `isinstance(model, DeepSpeedEngine)`. While deepspeed has not been imported, no object can be a
`DeepSpeedEngine`, so that test is false and the import (seconds on the first save of a process) is pure
cost. Here accelerate is told deepspeed is unavailable for the duration of the save, and only then.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

_ACCELERATE_MODULE = "accelerate.utils.other"
_lock = threading.Lock()
_depth = 0
_original = None


@contextlib.contextmanager
def deepspeed_probe_skipped_while_unloaded() -> Iterator[None]:
    """Within the block, accelerate's unwrap treats deepspeed as unavailable if it has not been imported."""
    global _depth, _original
    module = sys.modules.get(_ACCELERATE_MODULE)
    if module is None or "deepspeed" in sys.modules or not hasattr(module, "is_deepspeed_available"):
        yield
        return
    with _lock:  # nested or concurrent saves (a background writer) patch once and restore once
        if _depth == 0:
            _original = module.is_deepspeed_available
            module.is_deepspeed_available = _deepspeed_not_loaded
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                module.is_deepspeed_available = _original
                _original = None


def _deepspeed_not_loaded() -> bool:
    """True once deepspeed is imported (by anyone, mid-save included), else False: no engine can exist."""
    return "deepspeed" in sys.modules and bool(_original and _original())
