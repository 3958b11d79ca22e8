"""Whether a method is still the base one, so a shortcut that skips a call known to do nothing stays exact."""

from __future__ import annotations

from typing import Any

__all__ = ["is_base_method"]


def is_base_method(bound_method: Any, base_function: Any) -> bool:
    """Whether `bound_method` (read from an instance) is `base_function` bound: not overridden on the instance's
    class or on the instance itself. Compare with a function captured at import to also catch a later class patch."""
    return getattr(bound_method, "__func__", None) is base_function
