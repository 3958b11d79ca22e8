"""Warnings that point at the user's line: the first caller outside hf_lightning, however deep the call."""

from __future__ import annotations

import sys

_PACKAGE = __name__.split(".")[0]


def user_stacklevel() -> int:
    """The `stacklevel` that makes a `warnings.warn` in the caller name the first frame outside hf_lightning.

    Frames are told apart by their module (`f_globals["__name__"]`), so the `__init__` a dataclass generates for
    one of our argument classes counts as ours too.
    """
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == _PACKAGE:
        frame = frame.f_back
        level += 1
    return level
