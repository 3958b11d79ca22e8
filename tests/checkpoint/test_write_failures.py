"""A save that cannot write names output_dir and the system's reason (no space, not writable), not a temporary
folder or torch's "unexpected pos"."""

from __future__ import annotations

import errno
import glob
import os
import re

import pytest
import torch

from hf_lightning.checkpoint.fault_points import fault_hook
from hf_lightning.checkpoint.files import list_checkpoints
from hf_lightning.core.checkpoint_files import OPTIMIZER_NAME
from tests.checkpoint.test_resume_safety import train


def _scratch_file(run_dir, name: str) -> str:
    (scratch,) = glob.glob(os.path.join(run_dir, ".checkpoint-*.tmp-*"))
    return os.path.join(scratch, name)


def test_torch_says_unexpected_pos_on_a_full_device(tmp_path):
    """What torch itself reports when the device is full (/dev/full fails every write with ENOSPC)."""
    os.symlink("/dev/full", tmp_path / "state.pt")
    with pytest.raises(RuntimeError, match="unexpected pos"):
        torch.save({"w": torch.zeros(10_000)}, tmp_path / "state.pt")


def test_full_device_names_output_dir_and_no_space(tmp_path):
    run_dir = tmp_path / "run"

    def fill_device(point: str) -> None:
        if point == "optimizer":  # the optimizer file of the first save lands on a full device
            os.symlink("/dev/full", _scratch_file(run_dir, OPTIMIZER_NAME))

    with fault_hook(fill_device), pytest.raises(OSError) as failure:
        train(run_dir)
    message = str(failure.value)
    assert failure.value.errno == errno.ENOSPC
    assert f"output_dir {str(run_dir)!r}" in message and "No space left on device" in message
    assert "checkpoint-2" in message and ".tmp-" not in message and "unexpected pos" not in message
    assert list_checkpoints(str(run_dir)) == [] and not glob.glob(os.path.join(run_dir, ".checkpoint-*"))


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_unwritable_output_dir_names_it_and_the_reason(tmp_path, code):
    """The error an `open()` in a read-only (or not permitted) folder raises, met during the save (tests run as
    root in CI, where a mode bit does not stop a write, so the system's error is raised where it would occur)."""
    run_dir = tmp_path / "run"

    def refuse(point: str) -> None:
        if point == "model":
            path = _scratch_file(run_dir, "model.safetensors")
            raise OSError(code, os.strerror(code), path)

    with fault_hook(refuse), pytest.raises(OSError) as failure:
        train(run_dir)
    assert failure.value.errno == code
    assert isinstance(failure.value, PermissionError) == (code == errno.EACCES)
    assert re.search(re.escape(f"output_dir {str(run_dir)!r}: {os.strerror(code)}"), str(failure.value))
    assert "writable" in str(failure.value)
