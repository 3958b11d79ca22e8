"""`has_length`: whether a dataset or dataloader is sized, the test every sized/unsized decision uses.

Kept free of torch so the callbacks (which ask it of eval dataloaders) stay light to import.
"""

from __future__ import annotations

from typing import Any

__all__ = ["has_length"]


def has_length(obj: Any) -> bool:
    """True when `len(obj)` works (an unsized iterable or a Ray dataset raises instead)."""
    try:
        return len(obj) is not None
    except (TypeError, AttributeError):
        return False
