"""The output folder and the modes of the files written into it."""

from __future__ import annotations

import contextlib
import errno
import os

from hf_lightning.core.file_modes import give_ordinary_mode, ordinary_file_mode


def make_output_dir(path: str, field: str = "output_dir") -> None:
    """Create the folder `path` (and its parents); a clear error when an existing file is in the way."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(
            f"{field}={path!r} is an existing file, not a folder: give a folder path (created when missing) "
            "or move the file away."
        )
    os.makedirs(path, exist_ok=True)


def apply_umask(folder: str, suffix: str = ".safetensors") -> None:
    """Give the `suffix` files in `folder` the mode ordinary files get (0666 less the umask; core/file_modes.py)."""
    mode = ordinary_file_mode()
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if name.endswith(suffix) and os.path.isfile(path):
            give_ordinary_mode(path, mode)


# errno -> what to do about it, for the causes a save into output_dir commonly meets.
_NO_SPACE = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)
_PROBE_BYTES = 1 << 20


def write_failure(output_dir: str, what: str, scratch_dir: str | None, error: BaseException) -> OSError | None:
    """An OSError naming `output_dir` and the operating system's reason a write there failed, or None.

    torch reports a full disk as "unexpected pos ..." and a refused write names a temporary folder; the reason is
    taken from the error chain's OSError when there is one, else learnt by writing a probe of 1 MiB into
    `output_dir` and then onto each file of `scratch_dir` (the failed save's own files, deleted next).
    """
    code = _errno_in_chain(error) or _probe_folder(output_dir)
    if code is None and scratch_dir is not None and os.path.isdir(scratch_dir):
        for name in sorted(os.listdir(scratch_dir)):
            code = code or _probe_file(os.path.join(scratch_dir, name))
    if code is None:
        return None
    if code in _NO_SPACE:
        fix = (
            "free space on that device, or point output_dir at another one (save_total_limit bounds the "
            "checkpoints kept)"
        )
    elif code in _NOT_WRITABLE:
        fix = "make output_dir writable by this process, or point output_dir at a writable folder"
    else:
        fix = "check the device holding output_dir"
    return OSError(code, f"Cannot write {what} into output_dir {output_dir!r}: {os.strerror(code)}; {fix}")


def _errno_in_chain(error: BaseException | None) -> int | None:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno:
            return error.errno
        error = error.__cause__ or error.__context__
    return None


def _probe_folder(folder: str) -> int | None:
    path = os.path.join(folder, f".hf_lightning-write-probe-{os.getpid()}")
    try:
        _write_probe(path, "wb")
    except OSError as error:
        return error.errno
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)
    return None


def _probe_file(path: str) -> int | None:
    if not os.path.exists(path) or os.path.isdir(path):
        return None
    try:
        _write_probe(path, "ab")
    except OSError as error:
        return error.errno
    return None


def _write_probe(path: str, mode: str) -> None:
    with open(path, mode) as f:
        f.write(b"\0" * _PROBE_BYTES)
        f.flush()
        os.fsync(f.fileno())
