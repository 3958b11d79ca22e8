"""Signals during train(), sent to real child processes standing at named points.

Each child is forked from this (already imported) test process, so it starts in milliseconds. It trains until a
named point (`fault_points.reach`: `step:<N>` or a save point), tells the parent, and waits; the parent sends
the signal, then lets it go on. The reference is driven the same way through a callback at the same step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers

from hf_lightning import TrainingArguments
from hf_lightning.callbacks import TrainerCallback
from hf_lightning.checkpoint.fault_points import PAUSE_AT_ENV, PAUSE_FDS_ENV
from hf_lightning.checkpoint.files import checkpoint_problem, list_checkpoints
from hf_lightning.core.checkpoint_files import COMPLETE_MARKER_NAME
from hf_lightning.engine.signals import TERMINATED_MESSAGE
from hf_lightning.engine.slurm_requeue import REQUEUED_MESSAGE
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.checkpoint.test_resume_safety import SETTINGS, assert_bit_identical, step_logs, train, weights
from tests.models import DropoutMLP, regression_data

CHILD_TIMEOUT_S = 60
# Resolved here, in the parent, so a forked child does not import the reference's trainer again.
REFERENCE_TRAINER, REFERENCE_ARGUMENTS = transformers.Trainer, transformers.TrainingArguments
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Child:
    """A forked child running `work()`; it pauses at `pause_at` until the parent has sent its signal."""

    def __init__(self, tmp_path, work: Callable[[], dict], pause_at: str):
        self.result_path = tmp_path / "result.json"
        self.stderr_path = tmp_path / "stderr.txt"
        to_parent_r, to_parent_w = os.pipe()
        to_child_r, to_child_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - runs in the child
            code = 0
            try:
                os.close(to_parent_r)
                os.close(to_child_w)
                torch.set_num_threads(1)  # the parent's OpenMP team does not exist in a forked child
                stderr = os.open(self.stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(stderr, 2)
                sys.stderr = open(2, "w", buffering=1, closefd=False)  # past pytest's capture, onto the file
                os.environ[PAUSE_AT_ENV] = pause_at
                os.environ[PAUSE_FDS_ENV] = f"{to_parent_w},{to_child_r}"
                try:
                    result = work()
                except KeyboardInterrupt:
                    result = {"raised": "KeyboardInterrupt", "sigint_handler": _handler_name(signal.SIGINT)}
                self.result_path.write_text(json.dumps(result))
            except BaseException as error:
                self.result_path.write_text(json.dumps({"raised": f"{type(error).__name__}: {error}"}))
                code = 3
            finally:
                os._exit(code)
        os.close(to_parent_w)
        os.close(to_child_r)
        self._from_child, self._to_child = to_parent_r, to_child_w

    def wait_for_point(self) -> str:
        """The name of the point the child stands at (it waits there)."""
        line = b""
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while not line.endswith(b"\n"):
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail("the child never reached its pause point")
            chunk = os.read(self._from_child, 64)
            if not chunk:
                pytest.fail(f"the child ended before its pause point: {self.result()}")
            line += chunk
        return line.decode().strip()

    def send(self, signum: int) -> None:
        """Send `signum` to the waiting child, then let it go on."""
        os.kill(self.pid, signum)
        time.sleep(0.05)  # the child handles the signal inside its blocking read, before the go-ahead
        try:
            os.write(self._to_child, b"g")
        except BrokenPipeError:  # it ended on the signal
            pass

    def go_on(self) -> None:
        """Let the waiting child go on, with no signal."""
        os.write(self._to_child, b"g")

    def wait(self) -> int:
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self._from_child)
                os.close(self._to_child)
                return status
            time.sleep(0.01)
        self.kill()
        pytest.fail(f"the child hung for {CHILD_TIMEOUT_S} s")

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)

    def result(self) -> dict | None:
        return json.loads(self.result_path.read_text()) if self.result_path.exists() else None

    def stderr(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""


def _handler_name(signum: int) -> str:
    handler = signal.getsignal(signum)
    if isinstance(handler, signal.Handlers):
        return handler.name
    return getattr(handler, "__name__", str(handler))


def run_with_signal(tmp_path, work, pause_at: str, signum: int) -> tuple[int, Child]:
    child = Child(tmp_path, work, pause_at)
    assert child.wait_for_point() == pause_at.partition("#")[0]
    child.send(signum)
    return child.wait(), child


def our_training(run_dir, **extra) -> Callable[[], dict]:
    def work() -> dict:
        trainer = HFLightningTrainer(
            model=DropoutMLP(0),
            args=TrainingArguments(output_dir=str(run_dir), **{**SETTINGS, **extra}),
            train_dataset=regression_data(10),
        )
        output = trainer.train()
        return {"global_step": output.global_step, "sigterm_handler": _handler_name(signal.SIGTERM)}

    return work


class PauseAtStepEnd(TrainerCallback):
    """For the reference, which has no named points: the same pause, at the end of step `step`."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            from hf_lightning.checkpoint import fault_points

            fault_points._pause(f"step:{self.step}")


def reference_training(run_dir, step: int) -> Callable[[], dict]:
    def work() -> dict:
        trainer = REFERENCE_TRAINER(
            model=DropoutMLP(0),
            args=REFERENCE_ARGUMENTS(output_dir=str(run_dir), **SETTINGS),
            train_dataset=regression_data(10),
            callbacks=[PauseAtStepEnd(step)],
        )
        return {"global_step": trainer.train().global_step}

    return work


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    return train(tmp_path_factory.mktemp("straight-signals"))


# ---- SIGTERM without enable_jit_checkpoint ------------------------------------------------------------------


def test_sigterm_ends_the_process_as_the_reference(tmp_path):
    (tmp_path / "ours").mkdir()
    (tmp_path / "ref").mkdir()
    ours, child = run_with_signal(tmp_path / "ours", our_training(tmp_path / "ours" / "run"), "step:3", signal.SIGTERM)
    reference, _ = run_with_signal(
        tmp_path / "ref", reference_training(tmp_path / "ref" / "run", 3), "step:3", signal.SIGTERM
    )
    assert os.WIFSIGNALED(reference) and os.WTERMSIG(reference) == signal.SIGTERM  # a shell reports 143
    assert os.WIFSIGNALED(ours) and os.WTERMSIG(ours) == signal.SIGTERM
    assert child.result() is None
    stderr = child.stderr()
    assert stderr.count(TERMINATED_MESSAGE) == 1 and "Traceback" not in stderr
    # The checkpoints of the steps before the signal are there and whole; nothing after it.
    assert [step for step, _ in list_checkpoints(str(tmp_path / "ours" / "run"))] == [2]
    # The same line names it and the call that resumes from it.
    checkpoint = str(tmp_path / "ours" / "run" / "checkpoint-2")
    line = next(line for line in stderr.splitlines() if line.startswith(TERMINATED_MESSAGE))
    assert line.endswith(
        f" Stopped at step 3; last complete checkpoint: {checkpoint}; resume with: "
        f"trainer.train(resume_from_checkpoint={checkpoint!r})"
    ), line


@pytest.mark.slow
def test_sigterm_exit_status_is_143_in_a_shell(tmp_path):
    """One real `python` process started from a shell, as a scheduler sees it."""
    script = (
        "import os, signal, sys\n"
        f"sys.path.insert(0, {ROOT!r})\n"
        "from hf_lightning.callbacks import TrainerCallback\n"
        "from tests.engine.test_signals import our_trainer\n"
        "class Term(TrainerCallback):\n"
        "    def on_step_end(self, args, state, control, **kwargs):\n"
        "        if state.global_step == 2: os.kill(os.getpid(), signal.SIGTERM)\n"
        f"our_trainer({str(tmp_path / 'run')!r}, [Term()]).train()\n"
    )
    (tmp_path / "script.py").write_text(script)
    shell = subprocess.run(
        ["sh", "-c", f"{sys.executable} {tmp_path / 'script.py'}; echo status=$?"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert "status=143" in shell.stdout, shell.stderr[-2000:]
    assert "Traceback" not in shell.stderr


def our_trainer(output_dir: str, callbacks: list, **extra) -> HFLightningTrainer:
    return HFLightningTrainer(
        model=DropoutMLP(0),
        args=TrainingArguments(output_dir=output_dir, **{**SETTINGS, **extra}),
        train_dataset=regression_data(10),
        callbacks=callbacks,
    )


# ---- SIGTERM with enable_jit_checkpoint ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pause_at", "expected_step"),
    [("step:2", 3), ("optimizer#2", 5)],
    ids=["after a save", "during a save"],
)
def test_jit_checkpoint_at_the_next_update_boundary_then_train_returns(tmp_path, straight, pause_at, expected_step):
    run_dir = tmp_path / "run"
    status, child = run_with_signal(tmp_path, our_training(run_dir, enable_jit_checkpoint=True), pause_at, signal.SIGTERM)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, child.result()
    result = child.result()
    assert result["global_step"] == expected_step  # train() returned normally, at the saved step
    assert result["sigterm_handler"] == "SIG_DFL"  # the handler in place before train() is back
    jit_checkpoint = run_dir / f"checkpoint-{expected_step}"
    assert checkpoint_problem(str(jit_checkpoint)) is None and (jit_checkpoint / COMPLETE_MARKER_NAME).exists()
    # The checkpoint is complete: a resume from it reproduces the uninterrupted run exactly.
    resumed = train(run_dir, resume=True, model_seed=7)
    assert resumed.state.global_step == 8
    assert_bit_identical(weights(resumed), weights(straight))
    assert step_logs(resumed) == step_logs(straight)


def test_jit_checkpoint_saves_what_the_reference_saves(tmp_path):
    """The reference's JIT save is its `_save_checkpoint`: the same files (ours adds the completion marker)."""
    run_dir = tmp_path / "run"
    status, _ = run_with_signal(tmp_path, our_training(run_dir, enable_jit_checkpoint=True), "step:2", signal.SIGTERM)
    assert os.WIFEXITED(status)
    ours = sorted(os.listdir(run_dir / "checkpoint-3"))
    reference_run = tmp_path / "reference"
    trainer = transformers.Trainer(
        model=DropoutMLP(0),
        args=transformers.TrainingArguments(output_dir=str(reference_run), **{**SETTINGS, "max_steps": 3}),
        train_dataset=regression_data(10),
    )
    trainer.train()
    trainer._save_checkpoint(trainer.model, trial=None)  # what its JIT callback calls at step 3
    assert sorted(set(ours) - {COMPLETE_MARKER_NAME}) == sorted(os.listdir(reference_run / "checkpoint-3"))


# ---- SIGINT ---------------------------------------------------------------------------------------------------


def test_sigint_raises_keyboard_interrupt_out_of_train(tmp_path):
    status, child = run_with_signal(tmp_path, our_training(tmp_path / "run"), "step:3", signal.SIGINT)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, child.result()
    assert child.result() == {"raised": "KeyboardInterrupt", "sigint_handler": "default_int_handler"}
    checkpoint = str(tmp_path / "run" / "checkpoint-2")
    assert (
        f"hf_lightning: train() interrupted (Ctrl+C) at step 3; last complete checkpoint: {checkpoint}; resume "
        f"with: trainer.train(resume_from_checkpoint={checkpoint!r})"
    ) in child.stderr().splitlines(), child.stderr()[-3000:]


def test_sigint_in_the_reference_is_keyboard_interrupt_too(tmp_path):
    status, child = run_with_signal(tmp_path, reference_training(tmp_path / "run", 3), "step:3", signal.SIGINT)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, child.result()
    assert child.result()["raised"] == "KeyboardInterrupt"


# ---- SLURM: the requeue signal writes our checkpoint --------------------------------------------------------------


def _slurm_job(tmp_path, monkeypatch) -> Path:
    """One SLURM task (Lightning's `SLURMEnvironment`, auto-requeue on) whose `scontrol` records its calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol-calls.txt"
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    (bin_dir / "scontrol").chmod(0o755)
    slurm = {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "4242", "SLURM_PROCID": "0",
             "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    return calls


def test_slurm_requeue_signal_saves_our_checkpoint_requeues_and_the_job_continues(tmp_path, monkeypatch, straight):
    """Under SLURM's auto-requeue, SIGUSR1 (the scheduler's warning) saves one complete HF checkpoint at the next
    update boundary, requeues the job and ends the process by the signal, as the reference's process ends on it; the
    requeued job continues from that checkpoint to the uninterrupted run's weights, bit for bit."""
    calls = _slurm_job(tmp_path, monkeypatch)
    (tmp_path / "ours").mkdir()
    (tmp_path / "ref").mkdir()
    run_dir = tmp_path / "ours" / "run"
    status, child = run_with_signal(tmp_path / "ours", our_training(run_dir), "step:3", signal.SIGUSR1)
    reference, _ = run_with_signal(
        tmp_path / "ref", reference_training(tmp_path / "ref" / "run", 3), "step:3", signal.SIGUSR1
    )
    assert os.WIFSIGNALED(reference) and os.WTERMSIG(reference) == signal.SIGUSR1
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGUSR1, (child.result(), child.stderr()[-3000:])
    assert calls.read_text().split() == ["requeue", "4242"]
    saved = run_dir / "checkpoint-3"  # the boundary after the signal, outside the save_steps=2 rule
    assert checkpoint_problem(str(saved)) is None and (saved / COMPLETE_MARKER_NAME).exists()
    assert not [name for name in os.listdir(run_dir) if name.startswith("hpc_ckpt_")]  # no Lightning file
    assert f"{REQUEUED_MESSAGE} saved {saved} at step 3; the job is requeued and continues from it." in (
        child.stderr().splitlines()
    ), child.stderr()[-3000:]
    # The requeued job runs the same script: it continues from checkpoint-3 (checkpoint/restart.py).
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    requeued = train(run_dir)
    assert requeued.state.global_step == 8
    assert_bit_identical(weights(requeued), weights(straight))
    assert step_logs(requeued) == step_logs(straight)


def test_a_users_requeue_signal_handler_is_kept_under_slurm(tmp_path, monkeypatch):
    """A SIGUSR1 handler installed before train() stays in place (Lightning keeps it too): no checkpoint, no requeue."""
    calls = _slurm_job(tmp_path, monkeypatch)
    received = []

    def work() -> dict:
        signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
        result = our_training(tmp_path / "run")()
        return {**result, "received": received}

    status, child = run_with_signal(tmp_path, work, "step:3", signal.SIGUSR1)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (child.result(), child.stderr()[-3000:])
    assert child.result()["global_step"] == 8 and child.result()["received"] == [signal.SIGUSR1]
    assert not calls.exists()
    assert not (tmp_path / "run" / "checkpoint-3").exists()


# ---- DDP: every process stops at the same boundary ---------------------------------------------------------------


def _jit_launch(tmp_path, **env) -> tuple[subprocess.CompletedProcess, float]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    script = os.path.join(ROOT, "tests", "distributed", "jit_checkpoint_script.py")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
        "--master_addr=127.0.0.1", script, str(tmp_path),
    ]
    started = time.monotonic()
    completed = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )
    return completed, time.monotonic() - started


@pytest.mark.slow
@pytest.mark.parametrize(("plan", "expected_step"), [("one", 3), ("staggered", 3)])
def test_under_ddp_a_sigterm_to_one_process_stops_all_at_one_boundary(tmp_path, plan, expected_step):
    """One process signalled, or each in turn (rank 0 after update 2, rank 1 after update 3): every process stops
    at the same boundary, after one complete checkpoint, and train() returns on both (nobody waits in a collective)."""
    completed, _ = _jit_launch(tmp_path, SIGTERM_PLAN=plan)
    assert completed.returncode == 0, completed.stderr[-4000:]
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert results[0] == results[1]  # the same step, the same folder seen by both
    assert results[0]["global_step"] == expected_step  # the first signal, at the end of step 2: the next boundary
    files = results[0]["checkpoints"][f"checkpoint-{expected_step}"]
    assert {"rng_state_0.pth", "rng_state_1.pth", COMPLETE_MARKER_NAME} <= set(files)
    assert checkpoint_problem(str(tmp_path / "run" / f"checkpoint-{expected_step}")) is None
    assert list(results[0]["checkpoints"]) == [f"checkpoint-{expected_step}"]


@pytest.mark.slow
@pytest.mark.parametrize("plan", ["one", "staggered"])
def test_under_ddp_without_jit_every_process_ends_by_the_signal(tmp_path, plan):
    """Without enable_jit_checkpoint a signalled process ends as the reference's (status 143, its one line) and the
    launcher ends the others: nobody hangs in a collective, no checkpoint folder is left half written."""
    completed, elapsed = _jit_launch(tmp_path, SIGTERM_PLAN=plan, JIT="0")
    assert completed.returncode != 0
    assert TERMINATED_MESSAGE in completed.stderr
    assert "exitcode  : -15" in completed.stderr or "exitcode  : 143" in completed.stderr
    assert elapsed < 120  # bounded by the launcher's teardown, not by a collective's timeout
    assert not (tmp_path / "rank0.json").exists() and not (tmp_path / "rank1.json").exists()
    leftovers = os.listdir(tmp_path / "run") if (tmp_path / "run").exists() else []
    assert not [name for name in leftovers if name.startswith(("checkpoint-", ".checkpoint-"))]
