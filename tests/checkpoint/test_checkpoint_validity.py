"""Checkpoint validity is decided by the files, not by the completion marker alone.

`resume_from_checkpoint=True` skips a damaged newest checkpoint with a warning naming it and what is wrong, and
resumes from the newest valid one; an explicit path to a damaged one is refused before training, naming the file
and the reason; rotation never leaves only a damaged checkpoint behind.
"""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from hf_lightning.checkpoint.files import checkpoint_problem, checkpoints_to_delete, list_checkpoints
from hf_lightning.core.checkpoint_files import (
    COMPLETE_MARKER_NAME,
    OPTIMIZER_NAME,
    SAFE_WEIGHTS_NAME,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
    safe_torch_load,
)
from tests.checkpoint.chosen_checkpoints import record_chosen_checkpoints
from tests.checkpoint.test_resume_safety import assert_bit_identical, reference_trainer, train, weights

RESUME_LOGGER = "hf_lightning.checkpoint.resume"


def _truncate(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _state_without(key: str):
    def damage(path) -> None:
        content = json.loads(path.read_text())
        del content[key]
        path.write_text(json.dumps(content))

    return damage


# file name -> (damage, what the message must say). Every one of them carries our completion marker.
DAMAGES = {
    "weights truncated": (SAFE_WEIGHTS_NAME, _truncate, "not a complete safetensors file"),
    "optimizer truncated": (OPTIMIZER_NAME, _truncate, "Cannot read"),
    "state garbage": (TRAINER_STATE_NAME, lambda path: path.write_text("not json"), "not valid JSON"),
    "state empty": (TRAINER_STATE_NAME, lambda path: path.write_text("{}"), "incomplete: it has no global_step"),
    "state incomplete": (TRAINER_STATE_NAME, _state_without("log_history"), "incomplete: it has no log_history"),
    "state wrong type": (
        TRAINER_STATE_NAME,
        lambda path: path.write_text(json.dumps({**json.loads(path.read_text()), "global_step": "4"})),
        "global_step has the wrong type",
    ),
    # Bytes on which torch's unpickler fails with IndexError, UnicodeDecodeError and KeyError.
    "rng stop opcode": ("rng_state.pth", lambda path: path.write_bytes(b"."), ""),
    "rng bad text": ("rng_state.pth", lambda path: path.write_bytes(b"XR\xcd\xea\xe1\xee\xea\x82|`\xbd"), ""),
    "rng bad memo": ("rng_state.pth", lambda path: path.write_bytes(b"h\xb4\x90\xbd;\xec\xfa%"), ""),
    "rng not a state": ("rng_state.pth", lambda path: torch.save([1, 2], path), "is not an RNG state"),
}


@pytest.fixture(scope="module")
def stopped_template(tmp_path_factory):
    """A run stopped at step 4 (checkpoints 2 and 4), copied by each test."""
    run_dir = tmp_path_factory.mktemp("template") / "run"
    train(run_dir, stop_at=4)
    return run_dir


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    return train(tmp_path_factory.mktemp("straight-validity"))


@pytest.fixture
def stopped(stopped_template, tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(stopped_template, run_dir)
    return run_dir


@pytest.mark.parametrize("case", list(DAMAGES))
def test_damaged_checkpoint_with_marker_is_invalid(stopped, case):
    name, damage, reason = DAMAGES[case]
    checkpoint = stopped / "checkpoint-4"
    assert (checkpoint / COMPLETE_MARKER_NAME).exists()
    damage(checkpoint / name)
    problem = checkpoint_problem(str(checkpoint))
    assert problem is not None and str(checkpoint / name) in problem and reason in problem
    # The reference's layout without our marker: the same rule.
    os.remove(checkpoint / COMPLETE_MARKER_NAME)
    assert checkpoint_problem(str(checkpoint)) == problem
    assert checkpoint_problem(str(stopped / "checkpoint-2")) is None


@pytest.mark.parametrize("case", ["rng stop opcode", "rng bad text", "rng bad memo"])
def test_garbage_rng_file_is_a_value_error_naming_it(stopped, case):
    """torch's own errors on these bytes are IndexError / UnicodeDecodeError / KeyError; ours name the file."""
    name, damage, _ = DAMAGES[case]
    path = stopped / "checkpoint-4" / name
    damage(path)
    with pytest.raises((IndexError, UnicodeDecodeError, KeyError)):
        torch.load(path, weights_only=True)
    with pytest.raises(ValueError, match=re.escape(str(path))):
        safe_torch_load(str(path), numpy_allowed=True)


@pytest.mark.parametrize("case", ["weights truncated", "state garbage", "state empty", "rng stop opcode"])
def test_resume_true_skips_damaged_newest_with_a_warning(stopped, straight_run, monkeypatch, caplog, case):
    name, damage, reason = DAMAGES[case]
    damage(stopped / "checkpoint-4" / name)
    chosen = record_chosen_checkpoints(monkeypatch)
    with caplog.at_level("WARNING", logger=RESUME_LOGGER):
        resumed = train(stopped, resume=True, model_seed=7)
    assert chosen == [str(stopped / "checkpoint-2")]
    warning = [record.getMessage() for record in caplog.records if "Skipping checkpoint" in record.getMessage()]
    assert len(warning) == 1 and str(stopped / "checkpoint-4") in warning[0] and reason in warning[0]
    assert resumed.state.global_step == 8
    assert_bit_identical(weights(resumed), weights(straight_run))


@pytest.mark.parametrize("case", list(DAMAGES))
def test_explicit_damaged_checkpoint_is_refused_before_training(stopped, case):
    name, damage, reason = DAMAGES[case]
    checkpoint = stopped / "checkpoint-4"
    damage(checkpoint / name)
    before = sorted(os.listdir(stopped))
    with pytest.raises(ValueError, match=re.escape(str(checkpoint / name))) as refused:
        train(stopped, resume=str(checkpoint))
    assert reason in str(refused.value)
    assert sorted(os.listdir(stopped)) == before  # nothing trained, nothing saved


def test_reference_fails_on_an_empty_state_naming_no_file(stopped):
    """docs/divergences.md: the reference fails on `{}` with a TypeError deep in its argument comparison; ours is
    a ValueError naming the file, raised before training."""
    (stopped / "checkpoint-4" / TRAINER_STATE_NAME).write_text("{}")
    with pytest.raises(TypeError) as reference_error:
        reference_trainer(stopped / "reference").train(resume_from_checkpoint=str(stopped / "checkpoint-4"))
    assert TRAINER_STATE_NAME not in str(reference_error.value)
    with pytest.raises(ValueError, match=re.escape(str(stopped / "checkpoint-4" / TRAINER_STATE_NAME))):
        train(stopped, resume=str(stopped / "checkpoint-4"))


def test_resume_true_without_any_valid_checkpoint_names_each(stopped, caplog):
    for step in (2, 4):
        (stopped / f"checkpoint-{step}" / TRAINER_STATE_NAME).write_text("{}")
    with caplog.at_level("WARNING", logger=RESUME_LOGGER), pytest.raises(ValueError, match="No valid checkpoint"):
        train(stopped, resume=True)
    assert str(stopped / "checkpoint-4") in caplog.text and str(stopped / "checkpoint-2") in caplog.text


# ---- rotation ------------------------------------------------------------------------------------------------


def test_rotation_keeps_the_newest_valid_checkpoint_behind_a_damaged_newer_one(stopped):
    import shutil

    shutil.copytree(stopped / "checkpoint-4", stopped / "checkpoint-6")
    _truncate(stopped / "checkpoint-6" / SAFE_WEIGHTS_NAME)
    checkpoints = list_checkpoints(str(stopped))
    doomed = checkpoints_to_delete(checkpoints, 1, None)
    assert doomed == [str(stopped / "checkpoint-2")]
    # Step order alone (every folder valid) would keep only the newest one.
    assert checkpoints_to_delete(checkpoints, 1, None, is_valid=lambda path: True) == [
        str(stopped / "checkpoint-2"),
        str(stopped / "checkpoint-4"),
    ]


def test_training_over_a_damaged_newest_keeps_a_valid_checkpoint(stopped, straight_run):
    """Resumed past a damaged checkpoint-4, the run rewrites it; at every save a valid checkpoint stays."""
    _truncate(stopped / "checkpoint-4" / SAFE_WEIGHTS_NAME)
    resumed = train(stopped, resume=True, model_seed=7)
    assert_bit_identical(weights(resumed), weights(straight_run))
    remaining = [path for _, path in list_checkpoints(str(stopped))]
    assert remaining == [str(stopped / "checkpoint-6"), str(stopped / "checkpoint-8")]
    assert all(checkpoint_problem(path) is None for path in remaining)


@pytest.mark.parametrize("resume, reads", [("explicit", 1), (True, 2)])
def test_a_resume_reads_the_optimizer_file_once_to_use_it(stopped, monkeypatch, resume, reads):
    """An explicit path's check leaves the optimizer file to the read that follows (which refuses a bad one naming
    it: `test_explicit_damaged_checkpoint_is_refused_before_training`); `True` checks each candidate once, then
    reads the chosen one's: no file is unpickled twice to be checked."""
    optimizer_reads = []
    original = torch.load

    def counting_load(file, *args, **kwargs):
        if os.path.basename(str(file)) == OPTIMIZER_NAME:
            optimizer_reads.append(str(file))
        return original(file, *args, **kwargs)

    monkeypatch.setattr(torch, "load", counting_load)
    checkpoint = stopped / "checkpoint-4"
    resumed = train(stopped, resume=str(checkpoint) if resume == "explicit" else True)
    assert optimizer_reads == [str(checkpoint / OPTIMIZER_NAME)] * reads
    assert resumed.state.global_step == 8


# ---- what a resume restores: the training state, and the step the folder is named after -------------------------

# The file removed -> the name the refusal must carry. Each one alone: the reference resumes without it, silently.
RESUME_STATE_FILES = {
    "optimizer": OPTIMIZER_NAME,
    "scheduler": SCHEDULER_NAME,
    "rng": "rng_state.pth",
}


def _set_step(checkpoint, step: int) -> None:
    path = checkpoint / TRAINER_STATE_NAME
    path.write_text(json.dumps({**json.loads(path.read_text()), "global_step": step}))


@pytest.mark.parametrize("ours", [True, False], ids=["with our marker", "reference layout"])
@pytest.mark.parametrize("missing", list(RESUME_STATE_FILES))
def test_explicit_checkpoint_missing_a_resume_file_is_refused_naming_it(stopped, ours, missing):
    checkpoint = stopped / "checkpoint-4"
    os.remove(checkpoint / RESUME_STATE_FILES[missing])
    if not ours:
        os.remove(checkpoint / COMPLETE_MARKER_NAME)
    before = sorted(os.listdir(stopped))
    with pytest.raises(ValueError, match=re.escape(str(checkpoint / RESUME_STATE_FILES[missing]))) as refused:
        train(stopped, resume=str(checkpoint))
    assert "is missing" in str(refused.value)
    assert sorted(os.listdir(stopped)) == before  # nothing trained, nothing saved


@pytest.mark.parametrize("missing", ["optimizer", "rng"])
def test_resume_true_passes_over_a_checkpoint_missing_a_resume_file(stopped, straight_run, monkeypatch, caplog, missing):
    os.remove(stopped / "checkpoint-4" / RESUME_STATE_FILES[missing])
    chosen = record_chosen_checkpoints(monkeypatch)
    with caplog.at_level("WARNING", logger=RESUME_LOGGER):
        resumed = train(stopped, resume=True, model_seed=7)
    assert chosen == [str(stopped / "checkpoint-2")]
    assert str(stopped / "checkpoint-4" / RESUME_STATE_FILES[missing]) in caplog.text
    assert_bit_identical(weights(resumed), weights(straight_run))


def test_reference_resumes_without_the_optimizer_silently(stopped):
    """docs/divergences.md: the reference continues from checkpoint-4 with a fresh optimizer state."""
    os.remove(stopped / "checkpoint-4" / OPTIMIZER_NAME)
    reference = reference_trainer(stopped / "reference")
    reference.train(resume_from_checkpoint=str(stopped / "checkpoint-4"))
    assert reference.state.global_step == 8


def test_a_save_only_model_checkpoint_is_refused_naming_that_setting(stopped):
    checkpoint = stopped / "checkpoint-4"
    for name in RESUME_STATE_FILES.values():
        os.remove(checkpoint / name)
    assert checkpoint_problem(str(checkpoint)) is None  # complete as written (rotation, get_last_checkpoint)
    with pytest.raises(ValueError, match=re.escape(f"{checkpoint} holds no optimizer, scheduler or RNG state")) as refused:
        train(stopped, resume=str(checkpoint))
    assert "save_only_model=True" in str(refused.value)


def test_explicit_checkpoint_holding_another_step_is_refused(stopped):
    """checkpoint-4 holding step 99: the reference resumes at step 99; ours names both steps."""
    checkpoint = stopped / "checkpoint-4"
    _set_step(checkpoint, 99)
    with pytest.raises(ValueError, match=r"holds global_step 99, but the folder is named for step 4"):
        train(stopped, resume=str(checkpoint))
    reference = reference_trainer(stopped / "reference")
    reference.train(resume_from_checkpoint=str(checkpoint))
    assert reference.state.global_step == 99  # past max_steps (8) at once: nothing trained


def test_resume_true_passes_over_a_checkpoint_holding_another_step(stopped, straight_run, monkeypatch, caplog):
    _set_step(stopped / "checkpoint-4", 99)
    chosen = record_chosen_checkpoints(monkeypatch)
    with caplog.at_level("WARNING", logger=RESUME_LOGGER):
        resumed = train(stopped, resume=True, model_seed=7)
    assert chosen == [str(stopped / "checkpoint-2")] and "holds global_step 99" in caplog.text
    assert_bit_identical(weights(resumed), weights(straight_run))
