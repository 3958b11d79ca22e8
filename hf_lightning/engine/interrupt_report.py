"""The one line printed when `train()` is interrupted (Ctrl+C, SIGTERM): where the run can resume from.

It names the newest checkpoint a resume accepts (checkpoint/files.py: complete, with its training state) and
the call that resumes from it, or the `hf-lightning fit` command when the run came from the console script
(which registers its command line here); without such a checkpoint, it says that a new run starts over.
"""

from __future__ import annotations

import os
import shlex
import sys

from hf_lightning.checkpoint.files import newest_valid_checkpoint
from hf_lightning.core.protocols import TrainerLike

_RESUME_COMMAND = {"template": None}


def set_resume_command(template: str | None) -> None:
    """The command that resumes this process's run, with `{checkpoint}` where the folder goes (None: the call)."""
    _RESUME_COMMAND["template"] = template


def resume_line(output_dir: str, global_step: int, event: str) -> str:
    """`event` at `global_step`, then the last complete checkpoint in `output_dir` and how to resume from it."""
    checkpoint = newest_valid_checkpoint(output_dir, resume=True)[0] if os.path.isdir(output_dir) else None
    if checkpoint is None:
        return (
            f"hf_lightning: {event} at step {global_step}; {output_dir} holds no complete checkpoint yet, so a new "
            "run starts over (save_steps / save_strategy decide when checkpoints are written)."
        )
    template = _RESUME_COMMAND["template"]
    how = (
        template.replace("{checkpoint}", shlex.quote(checkpoint))
        if template is not None
        else f"trainer.train(resume_from_checkpoint={checkpoint!r})"
    )
    return f"hf_lightning: {event} at step {global_step}; last complete checkpoint: {checkpoint}; resume with: {how}"


def report_interrupt(facade: TrainerLike, event: str) -> None:
    """Print `resume_line` on stderr, from the main process only."""
    if facade.args.process_index == 0:
        print(resume_line(facade.args.output_dir, facade.state.global_step, event), file=sys.stderr, flush=True)
