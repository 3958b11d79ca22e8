"""The checkpoint folder layout on disk: names, completeness, rotation and the atomic commit protocol.

Pure functions and small filesystem steps, no trainer state, so each is testable alone. The layout is the
reference's (`checkpoint-<global_step>/` with the same file names), plus one file of ours,
`hf_lightning_complete.json`, written last before the folder is renamed into place.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Collection

from hf_lightning.checkpoint.durability import fsync_directory
from hf_lightning.checkpoint.fault_points import reach
from hf_lightning.checkpoint.run_lock import live_scratch_tokens
from hf_lightning.core.checkpoint_files import (
    ADAPTER_SAFE_WEIGHTS_NAME,
    ADAPTER_WEIGHTS_NAME,
    CHECKPOINT_DIR_PATTERN,
    COMPLETE_MARKER_NAME,
    OPTIMIZER_NAME,
    PREFIX_CHECKPOINT_DIR,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    checkpoint_folder_name,
    safe_torch_load,
)
from hf_lightning.data.position_files import data_position_problem

CHECKPOINT_FORMAT = 1

# Our own scratch folders next to the checkpoints. The leading dot keeps them out of the reference's
# `checkpoint-*` glob and out of `CHECKPOINT_DIR_PATTERN`, so neither library ever resumes from one.
_SCRATCH_PATTERN = re.compile(r"^\." + PREFIX_CHECKPOINT_DIR + r"-\d+\.(tmp|old|deleting)-(.+)$")
_RNG_FILE_PATTERN = re.compile(r"^rng_state(_\d+)?\.pth$")

# ---- listing and completeness ---------------------------------------------------------------------------


def list_checkpoints(run_dir: str) -> list[tuple[int, str]]:
    """`(step, path)` of every folder named exactly `checkpoint-<digits>` in `run_dir`, complete or not."""
    if not os.path.isdir(run_dir):
        return []
    found = []
    for name in os.listdir(run_dir):
        match = CHECKPOINT_DIR_PATTERN.match(name)
        path = os.path.join(run_dir, name)
        if match is not None and os.path.isdir(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def is_complete_checkpoint(path: str) -> bool:
    """True when `path` is a checkpoint a resume can trust (`checkpoint_problem` finds nothing wrong)."""
    return checkpoint_problem(path) is None


# The trainer-state keys a resume reads: without them the run would restart at step 0 with default intervals.
_REQUIRED_STATE_KEYS = {
    "global_step": int,
    "max_steps": int,
    "logging_steps": (int, float),
    "save_steps": (int, float),
    "log_history": list,
}
_RNG_KEYS = ("python", "numpy", "cpu")
# Model files of strategies that save their own layout (FSDP's folders or files, DeepSpeed's `global_step*`).
_SHARDED_MODEL_PREFIXES = ("pytorch_model_fsdp", "global_step")


def checkpoint_problem(path: str, read_next: Collection[str] = ()) -> str | None:
    """Why `path` is not a checkpoint a resume can trust (naming the file and what is wrong), or None.

    The files decide, the marker alone does not. Ours (completion marker present): the marker parses, and the
    weights, trainer state and every optimizer / scheduler / scaler / RNG / data-position file present load. The reference's (no
    marker): weights, optimizer, scheduler, RNG and trainer-state files are all present and load. "Load" is
    cheap: the safetensors header and its byte ranges against the file size, `torch.load(weights_only=True,
    mmap=True)` (tensors mapped, not read), and the trainer state parsed with its step and intervals present.
    The optimizer, scheduler and scaler files named in `read_next` are only checked for presence: the caller
    reads them right after with `safe_torch_load`, which refuses a bad one naming it, so they are read once.
    """
    if not os.path.isdir(path):
        return f"{path} is not a folder"
    marker = os.path.join(path, COMPLETE_MARKER_NAME)
    ours = os.path.exists(marker)
    if ours:
        try:
            with open(marker, encoding="utf-8") as f:
                content = json.load(f)
        except (OSError, ValueError) as error:
            return f"its completion marker {marker} is unreadable ({error})"
        if not isinstance(content, dict) or content.get("format") != CHECKPOINT_FORMAT:
            return f"its completion marker {marker} is not format {CHECKPOINT_FORMAT}"
    problem = weights_problem(path, required=not ours or not _has_sharded_model(path))
    if problem is not None:
        return problem
    problem = trainer_state_problem(os.path.join(path, TRAINER_STATE_NAME))
    if problem is not None:
        return problem
    for name in (OPTIMIZER_NAME, SCHEDULER_NAME):
        file_path = os.path.join(path, name)
        if os.path.isfile(file_path):
            problem = None if name in read_next else _torch_file_problem(file_path)
        elif not ours:
            problem = f"{file_path} is missing"
        if problem is not None:
            return problem
    if os.path.isfile(os.path.join(path, SCALER_NAME)) and SCALER_NAME not in read_next:
        problem = _torch_file_problem(os.path.join(path, SCALER_NAME))
        if problem is not None:
            return problem
    rng_files = sorted(name for name in os.listdir(path) if _RNG_FILE_PATTERN.match(name))
    if not rng_files and not ours:
        return f"{os.path.join(path, 'rng_state.pth')} is missing"
    for name in rng_files:
        problem = rng_state_problem(os.path.join(path, name))
        if problem is not None:
            return problem
    return data_position_problem(path)


def _has_sharded_model(path: str) -> bool:
    return any(name.startswith(_SHARDED_MODEL_PREFIXES) for name in os.listdir(path))


def weights_problem(path: str, required: bool = True) -> str | None:
    """What is wrong with the model weights in checkpoint folder `path` (safetensors, sharded or not, or .bin)."""
    for name in (SAFE_WEIGHTS_NAME, ADAPTER_SAFE_WEIGHTS_NAME):
        if os.path.isfile(os.path.join(path, name)):
            return _safetensors_problem(os.path.join(path, name))
    for index_name, shard_check in (
        (SAFE_WEIGHTS_INDEX_NAME, _safetensors_problem),
        (WEIGHTS_INDEX_NAME, _torch_file_problem),
    ):
        index_path = os.path.join(path, index_name)
        if os.path.isfile(index_path):
            try:
                with open(index_path, encoding="utf-8") as f:
                    shards = sorted(set(json.load(f)["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
                return f"{index_path} is not a weight index ({type(error).__name__}: {error})"
            for shard in shards:
                problem = shard_check(os.path.join(path, shard))
                if problem is not None:
                    return problem
            return None
    for name in (WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME):
        if os.path.isfile(os.path.join(path, name)):
            return _torch_file_problem(os.path.join(path, name))
    return f"{path} holds no model weights ({SAFE_WEIGHTS_NAME} or {WEIGHTS_NAME})" if required else None


def _safetensors_problem(file_path: str) -> str | None:
    from safetensors import safe_open

    if not os.path.isfile(file_path):
        return f"{file_path} is missing"
    # `safe_open` parses the header and checks that the tensors' byte ranges cover the file exactly, so a
    # truncated file fails here without reading the tensor data.
    try:
        with safe_open(file_path, framework="pt") as f:
            f.keys()
    except Exception as error:
        return f"{file_path} is not a complete safetensors file ({error})"
    return None


def _torch_file_problem(file_path: str, numpy_allowed: bool = False) -> str | None:
    if not os.path.isfile(file_path):
        return f"{file_path} is missing"
    try:
        # mmap: tensors are mapped, not read, so a multi-gigabyte optimizer state costs little to check.
        safe_torch_load(file_path, numpy_allowed=numpy_allowed, mmap=True)
    except ValueError as error:
        return str(error)
    return None


def rng_state_problem(file_path: str) -> str | None:
    """What is wrong with an `rng_state*.pth` file: unreadable, or not a dict of the generators' states."""
    try:
        content = safe_torch_load(file_path, numpy_allowed=True, mmap=True)
    except ValueError as error:
        return str(error)
    if not isinstance(content, dict) or any(key not in content for key in _RNG_KEYS):
        return f"{file_path} is not an RNG state (a dict with the keys {', '.join(_RNG_KEYS)})"
    return None


def trainer_state_problem(file_path: str) -> str | None:
    """What is wrong with a `trainer_state.json`: missing, not JSON, or without the step and intervals a resume
    reads (an empty `{}` would silently restart at step 0)."""
    if not os.path.isfile(file_path):
        return f"{file_path} is missing"
    try:
        with open(file_path, encoding="utf-8") as f:
            content = json.load(f)
    except (OSError, ValueError) as error:
        return f"{file_path} is not valid JSON ({error})"
    if not isinstance(content, dict):
        return f"{file_path} does not hold a JSON object"
    missing = [key for key in _REQUIRED_STATE_KEYS if key not in content]
    if missing:
        return f"{file_path} is incomplete: it has no {', '.join(missing)}"
    wrong = [
        key
        for key, kind in _REQUIRED_STATE_KEYS.items()
        if not isinstance(content[key], kind) or isinstance(content[key], bool)
    ]
    if wrong or content["global_step"] < 0:
        return f"{file_path} is damaged: {', '.join(wrong) or 'global_step'} has the wrong type or value"
    return None


# What a resume restores besides the weights and the trainer state; `save_only_model=True` writes none of them.
_OPTIMIZER_PREFIX = "optimizer"  # optimizer.pt, or FSDP's optimizer.bin / optimizer_<n> folders
_DEEPSPEED_PREFIX = "global_step"  # DeepSpeed's engine folder holds the optimizer (and its own scheduler)


def resume_problem(path: str) -> str | None:
    """What keeps a resume from `path` from continuing the run it saved (naming the file), or None.

    The trainer state must be for the step the folder is named after (`checkpoint-4` holding step 99 would resume
    at step 99), and the training state a resume restores must be there: the optimizer (`optimizer.pt`, FSDP's or
    DeepSpeed's files), `scheduler.pt` (DeepSpeed's own scheduler lives in its engine folder) and an RNG file.
    Without them the reference resumes with a fresh optimizer, silently. A folder with none of the three was
    saved with `save_only_model=True`, which is said. Checked on top of `checkpoint_problem` (whether the folder
    is complete as written: a `save_only_model` checkpoint is, for rotation and `get_last_checkpoint`).
    """
    problem = _step_problem(path)
    if problem is not None:
        return problem
    names = os.listdir(path)
    deepspeed = any(name.startswith(_DEEPSPEED_PREFIX) for name in names)
    has_optimizer = deepspeed or any(name.startswith(_OPTIMIZER_PREFIX) for name in names)
    has_scheduler = deepspeed or SCHEDULER_NAME in names
    has_rng = any(_RNG_FILE_PATTERN.match(name) for name in names)
    if not (has_optimizer or has_scheduler or has_rng):
        return (
            f"{path} holds no optimizer, scheduler or RNG state: it was saved with save_only_model=True, which "
            "keeps only the model, so training cannot continue from it. Load its weights into a new run "
            "(from_pretrained, or model.load_state_dict of its weights file)"
        )
    for present, name in ((has_optimizer, OPTIMIZER_NAME), (has_scheduler, SCHEDULER_NAME), (has_rng, "rng_state.pth")):
        if not present:
            return f"{os.path.join(path, name)} is missing, so the run would continue with a fresh {_STATE_OF[name]}"
    return None


_STATE_OF = {OPTIMIZER_NAME: "optimizer state", SCHEDULER_NAME: "learning-rate schedule", "rng_state.pth": "RNG state"}


def _step_problem(path: str) -> str | None:
    """A `checkpoint-<N>` folder whose `trainer_state.json` holds another `global_step` than N."""
    match = CHECKPOINT_DIR_PATTERN.match(os.path.basename(os.path.normpath(path)))
    state_path = os.path.join(path, TRAINER_STATE_NAME)
    if match is None or trainer_state_problem(state_path) is not None:
        return None  # no step in the name; a bad trainer state is reported by the other checks
    with open(state_path, encoding="utf-8") as f:
        step = json.load(f)["global_step"]
    if step != int(match.group(1)):
        return (
            f"{state_path} holds global_step {step}, but the folder is named for step {match.group(1)}: its files "
            "do not come from one save"
        )
    return None


def get_last_checkpoint(folder: str) -> str | None:
    """The complete `checkpoint-<N>` folder with the largest N in `folder`, or None.

    Like the reference's `get_last_checkpoint` (exact names only, files ignored), but invalid folders
    (`checkpoint_problem`) and our scratch folders are skipped.
    """
    return newest_valid_checkpoint(folder)[0]


def newest_valid_checkpoint(folder: str, resume: bool = False) -> tuple[str | None, list[tuple[str, str]]]:
    """The newest valid `checkpoint-<N>` in `folder` (or None), and `(path, problem)` of each newer one skipped.

    `resume`: valid also means a resume can continue from it (`resume_problem`).
    """
    skipped = []
    for _, path in reversed(list_checkpoints(folder)):
        problem = checkpoint_problem(path)
        if problem is None and resume:
            problem = resume_problem(path)
        if problem is None:
            return path, skipped
        skipped.append((path, problem))
    return None, skipped


# ---- rotation ----------------------------------------------------------------------------------------------


def _same_path(path: str) -> str:
    # The reference compares `str(Path(p))` strings; normalising to an absolute path also matches a relative and an
    # absolute spelling of the same folder, so the best checkpoint is never lost to a spelling difference.
    return os.path.normpath(os.path.abspath(path))


def checkpoints_to_delete(
    checkpoints: list[tuple[int, str]],
    save_total_limit: int | None,
    best_model_checkpoint: str | None,
    newest: str | None = None,
    is_valid: Callable[[str], bool] = is_complete_checkpoint,
) -> list[str]:
    """The folders the reference's `rotate_checkpoints` deletes, oldest first.

    Order oldest -> newest by step number. The reference orders by mtime (falling back to step order when the
    mtimes span under a second); for checkpoints this library writes, step order is mtime order, except for the
    folder just written (`newest`), which is the most recent whatever its step (a leftover `checkpoint-500` of an
    earlier run does not make a fresh `checkpoint-100` the oldest). Nothing is deleted while there are at most
    `save_total_limit` folders; otherwise the newest and the best are protected and the oldest unprotected ones go
    until `max(save_total_limit, len(protected))` remain. `save_total_limit` None or <= 0 keeps everything.
    With no `newest`, the newest folder `is_valid` accepts is protected as well (ours: never left with only a
    damaged checkpoint).
    """
    if save_total_limit is None or save_total_limit <= 0:
        return []
    ordered = [path for _, path in sorted(checkpoints)]
    if newest is not None:
        ordered = [path for path in ordered if _same_path(path) != _same_path(newest)] + [newest]
    if len(ordered) <= save_total_limit:
        return []
    protected = {_same_path(ordered[-1])}
    if newest is None:
        # Without a folder just written, the newest may be a damaged one: the newest valid folder stays too, so a
        # resume always has a checkpoint to go back to.
        valid = next((path for path in reversed(ordered) if is_valid(path)), None)
        if valid is not None:
            protected.add(_same_path(valid))
    if best_model_checkpoint is not None:
        protected.add(_same_path(best_model_checkpoint))
    num_to_keep = max(save_total_limit, len(protected))
    remaining = len(ordered)
    to_delete = []
    for path in ordered:
        if remaining <= num_to_keep:
            break
        if _same_path(path) not in protected:
            to_delete.append(path)
            remaining -= 1
    return to_delete


def checkpoints_to_delete_at_train_end(
    checkpoints: list[tuple[int, str]], save_total_limit: int | None, best_model_checkpoint: str | None
) -> list[str]:
    """The reference's end-of-training cleanup: with `save_total_limit == 1` and a best checkpoint, all others go.

    The newest checkpoint is deleted too when it is not the best. If the best folder is not among `checkpoints`
    nothing is deleted (the reference raises FileNotFoundError from `os.path.samefile` there).
    """
    if best_model_checkpoint is None or save_total_limit != 1:
        return []
    best = _same_path(best_model_checkpoint)
    if best not in {_same_path(path) for _, path in checkpoints}:
        return []
    return [path for _, path in sorted(checkpoints) if _same_path(path) != best]


def delete_checkpoint(path: str, token: str) -> None:
    """Delete a checkpoint folder so that no half-deleted folder ever carries a `checkpoint-N` name.

    The folder is first renamed to a scratch name (atomic), the rename made durable, then removed.
    """
    parent, name = os.path.split(os.path.normpath(path))
    doomed = os.path.join(parent, f".{name}.deleting-{token}")
    os.rename(path, doomed)
    fsync_directory(parent)
    shutil.rmtree(doomed, ignore_errors=True)


def rotate_checkpoints(
    run_dir: str,
    save_total_limit: int | None,
    best_model_checkpoint: str | None,
    newest: str | None,
    token: str,
) -> list[str]:
    """Apply `checkpoints_to_delete` to the folders in `run_dir`; returns the deleted paths."""
    doomed = checkpoints_to_delete(list_checkpoints(run_dir), save_total_limit, best_model_checkpoint, newest)
    for path in doomed:
        delete_checkpoint(path, token)
    return doomed


def clean_scratch_folders(run_dir: str, token: str, own_too: bool = False) -> list[str]:
    """Tidy scratch folders left by saves of killed processes. This save's own (same `token`) stay unless
    `own_too` (a failed save clears its own); those of every other live run writing into `run_dir` always stay
    (checkpoint/run_lock.py), so two runs in one folder never delete each other's work in progress.

    A killed replacement can leave the old `checkpoint-N` moved aside with no `checkpoint-N` in its place: a
    complete aside folder is renamed back. Everything else (temporaries, half-deleted folders) is removed.
    Returns the scratch names handled.
    """
    handled = []
    live = None
    for name in sorted(os.listdir(run_dir)):
        match = _SCRATCH_PATTERN.match(name)
        if match is None:
            continue
        owner = match.group(2)
        if owner == token and token:
            if not own_too:
                continue
        else:
            live = live_scratch_tokens(run_dir) if live is None else live
            if owner in live:
                continue
        path = os.path.join(run_dir, name)
        final_dir = os.path.join(run_dir, name[1:].split(".")[0])
        if match.group(1) == "old" and not os.path.exists(final_dir) and is_complete_checkpoint(path):
            os.rename(path, final_dir)
            fsync_directory(run_dir)
        else:
            shutil.rmtree(path, ignore_errors=True)
        handled.append(name)
    return handled


# ---- atomic commit -----------------------------------------------------------------------------------------


def temporary_checkpoint_dir(run_dir: str, global_step: int, token: str) -> str:
    """Where a save writes before its commit: a hidden sibling of the final folder, on the same filesystem."""
    return os.path.join(run_dir, f".{checkpoint_folder_name(global_step)}.tmp-{token}")


def write_complete_marker(path: str, global_step: int, samples_per_update: int | None = None) -> None:
    """Write the completion marker (durably). Must be the last file written into a checkpoint. `samples_per_update`
    (the run's global batch) lets a resume on another layout say before training when its data cannot continue."""
    marker = os.path.join(path, COMPLETE_MARKER_NAME)
    content: dict[str, int] = {"global_step": global_step, "format": CHECKPOINT_FORMAT}
    if samples_per_update is not None:
        content["samples_per_update"] = samples_per_update
    with open(marker, "w", encoding="utf-8") as f:
        json.dump(content, f)
        f.flush()
        os.fsync(f.fileno())
    fsync_directory(path)


def saved_samples_per_update(path: str) -> int | None:
    """The global batch (samples per update) the run that wrote checkpoint `path` trained with, when its marker
    records it (checkpoints of the reference and older ones do not)."""
    try:
        with open(os.path.join(path, COMPLETE_MARKER_NAME), encoding="utf-8") as f:
            value = json.load(f).get("samples_per_update")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None


def commit_checkpoint(temporary_dir: str, final_dir: str, token: str) -> None:
    """Rename a fully written temporary folder to `final_dir`, replacing an existing folder of that name.

    An existing `final_dir` is moved aside first and deleted only once the rename succeeded (a Python error in
    between moves it back). The parent folder is fsynced so the new name survives a power loss.
    """
    parent, name = os.path.split(os.path.normpath(final_dir))
    aside = None
    if os.path.exists(final_dir):
        aside = os.path.join(parent, f".{name}.old-{token}")
        reach("rename_aside")
        os.rename(final_dir, aside)
    try:
        reach("rename")
        os.rename(temporary_dir, final_dir)
    except BaseException:
        if aside is not None and not os.path.exists(final_dir):
            os.rename(aside, final_dir)
        raise
    fsync_directory(parent)
    if aside is not None:
        reach("delete_aside")
        shutil.rmtree(aside, ignore_errors=True)
