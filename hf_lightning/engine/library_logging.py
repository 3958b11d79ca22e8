"""`log_level` / `log_level_replica` applied to hf_lightning's own loggers, as they are to transformers'."""

from __future__ import annotations

import logging
import sys

LIBRARY_LOGGER = "hf_lightning"


def set_library_log_level(level: int) -> None:
    """Set the level of the `hf_lightning` loggers; give them a stderr handler when nothing else would print.

    Without any handler (no `logging.basicConfig`, no framework), Python prints only warnings, so the
    "***** Running training *****" banner of log_level="info" would never show. Where the application
    configured logging, records propagate to its handlers as before.
    """
    library = logging.getLogger(LIBRARY_LOGGER)
    library.setLevel(level)
    if not library.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        library.addHandler(handler)
