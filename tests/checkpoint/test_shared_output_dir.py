"""Two runs in one `output_dir`: a live run's scratch folders are never taken for a killed run's leftovers.

Run A (a forked child) stands still inside a save, its `.checkpoint-N.tmp-<pid>` folder written and not yet renamed.
Run B starts into the same folder: it is refused before training, naming A (the runs' locks live outside `output_dir`, which holds
only what the reference writes); with `HF_LIGHTNING_SHARE_OUTPUT_DIR=1`
it trains and saves beside A (as the reference lets both proceed), and A's save still commits afterwards. A killed
run's leftovers (scratch folders, a stale lock) are still tidied, the lock with a warning.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_lightning.checkpoint.files import is_complete_checkpoint
from hf_lightning.checkpoint.run_lock import (
    SHARE_OUTPUT_DIR_ENV,
    RunRecord,
    lock_path,
    read_locks,
    this_process,
)
from tests.checkpoint.test_resume_safety import train
from tests.engine.test_signals import Child


def _paused_run(tmp_path, run_dir) -> Child:
    """Run A, paused at the rename of its first checkpoint's scratch folder."""
    child_dir = tmp_path / "child"
    child_dir.mkdir()

    def work() -> dict:
        trainer = train(run_dir)
        return {"global_step": trainer.state.global_step}

    child = Child(child_dir, work, pause_at="rename")
    assert child.wait_for_point() == "rename"
    return child


def _scratch(run_dir) -> list[str]:
    return sorted(os.path.basename(path) for path in glob.glob(os.path.join(run_dir, ".checkpoint-*.tmp-*")))


def test_a_second_run_is_refused_before_training_naming_the_live_run(tmp_path):
    run_dir = tmp_path / "out"
    child = _paused_run(tmp_path, run_dir)
    try:
        scratch = _scratch(run_dir)
        assert scratch == [f".checkpoint-2.tmp-{child.pid}"]
        with pytest.raises(RuntimeError) as refused:
            train(run_dir)
        message = str(refused.value)
        assert f"process {child.pid}" in message and SHARE_OUTPUT_DIR_ENV in message and str(run_dir) in message
        assert _scratch(run_dir) == scratch  # nothing of A's touched
        assert not any(record.pid == os.getpid() for record in read_locks(str(run_dir)))
    finally:
        child.go_on()
    assert child.wait() == 0, child.stderr()
    assert child.result() == {"global_step": 8}


def test_with_the_opt_in_both_runs_finish_and_keep_their_checkpoints(tmp_path, monkeypatch, caplog):
    run_dir = tmp_path / "out"
    child = _paused_run(tmp_path, run_dir)
    monkeypatch.setenv(SHARE_OUTPUT_DIR_ENV, "1")
    try:
        with caplog.at_level(logging.WARNING, logger="hf_lightning.checkpoint.run_lock"):
            second = train(run_dir)  # saves at 2, 4, 6, 8: each save tidies the folder's scratch
        assert f"process {child.pid}" in caplog.text
        assert second.state.global_step == 8
        assert _scratch(run_dir) == [f".checkpoint-2.tmp-{child.pid}"]  # A's save in progress survived B's four
    finally:
        child.go_on()
    assert child.wait() == 0, child.stderr()
    assert child.result() == {"global_step": 8}
    for step in (6, 8):  # save_total_limit=2: the last two of either run, complete
        assert is_complete_checkpoint(str(run_dir / f"checkpoint-{step}"))
    assert _scratch(run_dir) == [] and read_locks(str(run_dir)) == []


def test_a_killed_runs_leftovers_and_stale_lock_are_cleared_with_a_note(tmp_path, caplog):
    run_dir = tmp_path / "out"
    run_dir.mkdir()
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(finished.stdout)
    dead = RunRecord(host=this_process().host, pid=dead_pid, started=1.0)
    lock = Path(lock_path(str(run_dir), dead))
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps({"host": dead.host, "pid": dead.pid, "started": dead.started}))
    (run_dir / f".checkpoint-4.tmp-{dead_pid}").mkdir()
    (run_dir / f".checkpoint-4.tmp-{dead_pid}" / "model.safetensors").write_bytes(b"half")
    with caplog.at_level(logging.WARNING, logger="hf_lightning.checkpoint.run_lock"):
        trainer = train(run_dir)
    assert trainer.state.global_step == 8
    assert f"process {dead_pid}" in caplog.text and "no longer running" in caplog.text
    assert not lock.exists() and _scratch(run_dir) == []
    assert read_locks(str(run_dir)) == []  # no lock of ours left behind either
    assert [name for name in os.listdir(run_dir) if name.startswith(".")] == []
