"""Restoring an interrupted Ray Tune search: the reference's `resume=` keyword (which it hands to `ray.tune.run`) on
Ray's `Tuner.restore`.

`hyperparameter_search(backend="ray", storage_path=..., name=..., resume=True)` run again after the search's driver
died restores the experiment at `storage_path/name` when `Tuner.can_restore` finds it (unfinished trials continue
from their last checkpoint, a trial on Ray Train workers from its Train run's last report) and starts a new search
otherwise, as `tune.run(resume=True)` documents. The suffixes `tune.run` takes choose what becomes of errored trials.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["restore_keywords", "search_to_restore"]

# `tune.run`'s suffixes of `resume` (ray/tune/tune.py `_build_resume_config_from_legacy_config`), as the flags of
# `Tuner.restore`.
_SUFFIXES = {
    "ERRORED": {"resume_errored": True},
    "RESTART_ERRORED": {"restart_errored": True},
    "ERRORED_ONLY": {"resume_unfinished": False, "resume_errored": True},
    "RESTART_ERRORED_ONLY": {"resume_unfinished": False, "restart_errored": True},
}
_REMOVED = ("LOCAL", "REMOTE", "PROMPT", "ERRORED_ONLY")


def restore_keywords(resume: Any) -> dict[str, bool] | None:
    """`Tuner.restore`'s flags for `tune.run`'s `resume` (True, "AUTO", with "+ERRORED"-like suffixes); None for
    False / None (a new search). Anything else is refused naming what `tune.run` accepts."""
    if resume is None or resume is False:
        return None
    if resume is True:
        return {"resume_unfinished": True}
    accepted = 'True, False or "AUTO", optionally suffixed with ' + ", ".join(f'"+{s}"' for s in _SUFFIXES)
    if not isinstance(resume, str):
        raise ValueError(f"hyperparameter_search(backend='ray', resume={resume!r}): resume takes {accepted}.")
    head, *suffixes = resume.split("+")
    if head in _REMOVED:
        raise ValueError(
            f"hyperparameter_search(backend='ray', resume={resume!r}): Ray has removed {head!r}; pass {accepted}."
        )
    unknown = [s for s in suffixes if s not in _SUFFIXES]
    if head != "AUTO" or unknown:
        raise ValueError(f"hyperparameter_search(backend='ray', resume={resume!r}): resume takes {accepted}.")
    flags = {"resume_unfinished": True}
    for suffix in suffixes:
        flags.update(_SUFFIXES[suffix])
    return flags


def search_to_restore(tune: Any, resume: Any, run_config: Any) -> tuple[str, dict[str, bool]] | None:
    """The experiment folder and `Tuner.restore` flags when `resume` asks to go on and `Tuner.can_restore` finds the
    search `run_config` names; None for a new search. Resuming needs the search's `name` (Tune's default is new each
    run)."""
    flags = restore_keywords(resume)
    if flags is None:
        return None
    if not run_config.name:
        raise ValueError(
            f"hyperparameter_search(backend='ray', resume={resume!r}) restores the search stored at "
            "storage_path/name: pass the interrupted search's name=... (and its storage_path=... unless it used "
            "Ray's default)."
        )
    path = f"{str(run_config.storage_path).rstrip('/')}/{run_config.name}"  # a local folder or a URI (s3://...)
    if not tune.Tuner.can_restore(path, storage_filesystem=run_config.storage_filesystem):
        logger.warning(f"hyperparameter_search(backend='ray', resume={resume!r}): no search to restore at {path}; "
                       "starting a new one.")
        return None
    logger.warning(
        f"hf_lightning: restoring the Ray Tune search at {path} (Tuner.restore): unfinished trials continue from "
        "their last checkpoint; the search keeps the settings it was started with."
    )
    return path, flags
