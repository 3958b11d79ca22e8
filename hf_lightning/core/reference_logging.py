"""The logger of the lines that reproduce the reference Trainer's own log lines (its training banner, its
warning on a resume with other arguments).

A script or test that watches transformers' logger (its `CaptureLogger`, or a handler on
`transformers.utils.logging`) sees the reference's lines there, at the verbosity `log_level` gives it. When
transformers was loaded as the trainer applied `log_level`, our copies of those lines go to the reference's
logger of the same module, so they reach the same place; otherwise to hf_lightning's own logger of the module,
which `log_level` sets (hf_lightning/engine/library_logging.py). Either way a line is printed once.
"""

from __future__ import annotations

import logging

_ROUTE = {"to_transformers": False}
_WARNED_ONCE: set[str] = set()


def route_reference_lines(to_transformers: bool) -> None:
    """Send the reference's lines to transformers' loggers (True) or to ours; set when `log_level` is applied."""
    _ROUTE["to_transformers"] = to_transformers


def reference_logger(reference_module: str, own_module: str) -> logging.Logger:
    """`reference_module`'s logger (e.g. `transformers.trainer`) when routed there, else `own_module`'s."""
    return logging.getLogger(reference_module if _ROUTE["to_transformers"] else own_module)


def warning_once(logger: logging.Logger, message: str) -> None:
    """The reference's `logger.warning_once`: the same message is logged once per process."""
    if message in _WARNED_ONCE:
        return
    _WARNED_ONCE.add(message)
    logger.warning(message)
