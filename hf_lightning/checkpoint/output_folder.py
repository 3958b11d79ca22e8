"""The output folder and the modes of the files written into it."""

from __future__ import annotations

import os


def make_output_dir(path: str, field: str = "output_dir") -> None:
    """Create the folder `path` (and its parents); a clear error when an existing file is in the way."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(
            f"{field}={path!r} is an existing file, not a folder: give a folder path (created when missing) "
            "or move the file away."
        )
    os.makedirs(path, exist_ok=True)


def apply_umask(folder: str, suffix: str = ".safetensors") -> None:
    """Give the `suffix` files in `folder` the mode ordinary files get (0666 less the umask).

    safetensors writes its files with mode 0600 whatever the umask, so saved weights would be private while
    config.json, the tokenizer and training_args.bin next to them follow the umask.
    """
    mask = os.umask(0)
    os.umask(mask)
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if name.endswith(suffix) and os.path.isfile(path):
            os.chmod(path, 0o666 & ~mask)
