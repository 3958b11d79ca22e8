"""The reference's truth-value parser for string settings (`fsdp_config`, `optim_args`)."""

from __future__ import annotations


def str_to_bool(value: str) -> bool:
    """The reference's truth-value parser (``"yes"``/``"1"``/``"on"``... → True); anything else → ValueError."""
    value = value.lower()
    if value in ("y", "yes", "t", "true", "on", "1"):
        return True
    if value in ("n", "no", "f", "false", "off", "0"):
        return False
    raise ValueError(f"invalid truth value {value!r}")
