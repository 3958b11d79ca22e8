"""What a save fsyncs, and in which order, now that writeback starts early and fsyncs run side by side
(hf_lightning/checkpoint/durability.py): every file once, before the marker; the folder once, after the marker;
the parent after the rename. The writeback hints never fail a save."""

from __future__ import annotations

import errno
import os
import stat
import threading

import pytest

import hf_lightning.checkpoint.durability as durability
from hf_lightning.checkpoint.durability import WritebackStarter, fsync_tree, writeback_while_writing
from hf_lightning.core.checkpoint_files import COMPLETE_MARKER_NAME
from tests.checkpoint.test_resume_safety import train


class Recorder:
    """Records every fsync (the inode and whether it is a folder) and every rename, in the order they happen."""

    def __init__(self, monkeypatch):
        self.events: list[tuple] = []
        self._lock = threading.Lock()
        original_fsync, original_rename = os.fsync, os.rename

        def fsync(fd):
            info = os.fstat(fd)
            original_fsync(fd)
            with self._lock:
                self.events.append(("fsync", info.st_ino, stat.S_ISDIR(info.st_mode)))

        def rename(source, destination, *args, **kwargs):
            original_rename(source, destination, *args, **kwargs)
            with self._lock:
                self.events.append(("rename", os.path.basename(str(destination))))

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "rename", rename)

    def fsync_indices(self, inode: int, since: int = 0) -> list[int]:
        return [
            i for i, event in enumerate(self.events) if i >= since and event[0] == "fsync" and event[1] == inode
        ]


def _tree(root):
    (root / "sub").mkdir(parents=True)
    for path in (root / "a.bin", root / "b.json", root / "sub" / "c.pt"):
        path.write_bytes(os.urandom(5000))
    return {p: os.stat(p).st_ino for p in (root / "a.bin", root / "b.json", root / "sub" / "c.pt", root / "sub", root)}


@pytest.mark.parametrize("include_root", [True, False])
def test_fsync_tree_fsyncs_each_file_once_then_each_folder_deepest_first(tmp_path, monkeypatch, include_root):
    inodes = _tree(tmp_path / "tree")
    recorder = Recorder(monkeypatch)
    fsync_tree(str(tmp_path / "tree"), include_root=include_root)
    files = [inodes[p] for p in inodes if p.is_file()]
    for inode in files:
        assert len(recorder.fsync_indices(inode)) == 1
    sub, root = inodes[tmp_path / "tree" / "sub"], inodes[tmp_path / "tree"]
    assert len(recorder.fsync_indices(sub)) == 1
    assert len(recorder.fsync_indices(root)) == (1 if include_root else 0)
    last_file = max(recorder.fsync_indices(inode)[0] for inode in files)
    assert recorder.fsync_indices(sub)[0] > last_file
    if include_root:
        assert recorder.fsync_indices(root)[0] > recorder.fsync_indices(sub)[0]


def test_a_failed_fsync_fails_fsync_tree(tmp_path, monkeypatch):
    inodes = _tree(tmp_path / "tree")
    broken = inodes[tmp_path / "tree" / "b.json"]
    original = os.fsync

    def fsync(fd):
        if os.fstat(fd).st_ino == broken:
            raise OSError(errno.EIO, "Input/output error")
        original(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError) as failure:
        fsync_tree(str(tmp_path / "tree"))
    assert failure.value.errno == errno.EIO


def test_a_committed_checkpoint_was_durable_before_its_rename(tmp_path, monkeypatch):
    """Every file of checkpoint-N fsynced exactly once before the marker's fsync; the folder fsynced after the
    marker and before the rename into place; the run folder fsynced after that rename."""
    recorder = Recorder(monkeypatch)
    run_dir = tmp_path / "run"
    train(run_dir)
    final = run_dir / "checkpoint-8"
    (rename_index,) = [i for i, e in enumerate(recorder.events) if e == ("rename", "checkpoint-8")]
    # This save's events only: inodes of files deleted by an earlier rotation are reused.
    (since,) = [i for i, e in enumerate(recorder.events) if e == ("rename", "checkpoint-6")]
    marker = recorder.fsync_indices(os.stat(final / COMPLETE_MARKER_NAME).st_ino, since)
    assert len(marker) == 1 and marker[0] < rename_index
    names = sorted(os.listdir(final))
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"} <= set(names)
    for name in names:
        if name == COMPLETE_MARKER_NAME:
            continue
        indices = recorder.fsync_indices(os.stat(final / name).st_ino, since)
        assert len(indices) == 1 and indices[0] < marker[0], name
    folder = recorder.fsync_indices(os.stat(final).st_ino, since)
    assert len(folder) == 1 and marker[0] < folder[0] < rename_index
    assert any(i > rename_index for i in recorder.fsync_indices(os.stat(run_dir).st_ino))


def test_writeback_hints_never_fail_and_stop_when_refused(tmp_path, monkeypatch):
    (tmp_path / "f").write_bytes(b"x" * 10_000)
    calls = []

    def refusing(fd, offset, nbytes, flags):
        calls.append(fd)
        return -1

    monkeypatch.setattr(durability, "_start_writeback_function", refusing)
    starter = WritebackStarter(str(tmp_path))
    starter()
    starter.start(str(tmp_path / "gone"))  # a file that does not exist is simply skipped
    assert len(calls) == 1 and not starter.enabled
    starter()
    assert len(calls) == 1  # refused once: no more hints


def test_writeback_hints_each_file_again_only_when_it_grew(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(durability, "_start_writeback_function", lambda fd, *args: calls.append(fd) or 0)
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    starter = WritebackStarter(str(tmp_path))
    starter()
    starter()
    assert len(calls) == 1
    with open(path, "ab") as f:
        f.write(b"y" * 100)
    starter()
    assert len(calls) == 2


def test_writeback_thread_ends_with_the_block(tmp_path, monkeypatch):
    monkeypatch.setattr(durability, "_start_writeback_function", lambda *args: 0)
    with writeback_while_writing(str(tmp_path)) as start_writeback:
        assert any(t.name == "hf_lightning-writeback" for t in threading.enumerate())
        start_writeback()
    assert not any(t.name == "hf_lightning-writeback" for t in threading.enumerate())


def test_without_the_hint_nothing_runs_and_the_save_is_the_same(tmp_path, monkeypatch):
    """Where `sync_file_range` does not exist (not Linux) no thread starts and the checkpoint is written alike."""
    monkeypatch.setattr(durability, "_start_writeback_function", None)
    with writeback_while_writing(str(tmp_path)) as start_writeback:
        assert not any(t.name == "hf_lightning-writeback" for t in threading.enumerate())
        start_writeback()
    train(tmp_path / "run")
    assert sorted(os.listdir(tmp_path / "run")) == ["checkpoint-6", "checkpoint-8"]
