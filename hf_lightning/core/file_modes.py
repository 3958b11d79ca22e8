"""Files written by libraries that ignore the umask get the mode ordinary files get.

safetensors writes its files with mode 0600 whatever the umask, so saved weights (and our data-state files) would be
private while config.json, the tokenizer and training_args.bin next to them follow the umask (0644 usually).
"""

from __future__ import annotations

import os


def ordinary_file_mode() -> int:
    """0666 less the process's umask: the mode `open(path, "w")` gives a new file."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def give_ordinary_mode(path: str, mode: int | None = None) -> None:
    """Set file `path` to `mode` (default: `ordinary_file_mode()`)."""
    os.chmod(path, ordinary_file_mode() if mode is None else mode)
