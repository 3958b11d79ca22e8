"""The one line printed when `train()` is interrupted (Ctrl+C, SIGTERM): where the run can resume from.

It names the newest checkpoint a resume accepts (checkpoint/files.py: complete, with its training state) and
the call that resumes from it, or the `hf-lightning fit` command when the run came from the console script
(which registers its command line here); without such a checkpoint, it says that a new run starts over. The line
starts on a line of its own (a progress bar may hold the cursor), and an interrupt that nothing catches ends with
that line and a one-line `KeyboardInterrupt` instead of a screen of traceback that would scroll it away
(`HF_LIGHTNING_FULL_TRACEBACK=1` shows the traceback).
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import TYPE_CHECKING

from hf_lightning.checkpoint.files import newest_valid_checkpoint

if TYPE_CHECKING:
    from hf_lightning.args.training_args import TrainingArguments

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


FULL_TRACEBACK_ENV = "HF_LIGHTNING_FULL_TRACEBACK"


def report_interrupt(
    args: TrainingArguments, global_step: int, event: str, interrupt: BaseException | None = None
) -> None:
    """Print `resume_line` for the run of `args` stopped at `global_step` on stderr, from the main process only;
    `interrupt`, left uncaught, then ends the process with one line instead of its traceback."""
    if args.process_index != 0:
        return
    print(own_line(resume_line(args.output_dir, global_step, event), close_bars=True),
          file=sys.stderr, flush=True)
    if interrupt is not None:
        interrupt.__dict__["hf_lightning_reported"] = True
        _install_quiet_excepthook()


def own_line(text: str, close_bars: bool = False) -> str:
    """`text` beginning a line of its own after the line an open progress bar holds on the terminal: the bars closed
    first (`close_bars`, their last state kept above the line), else a newline put before it (from a signal
    handler, where closing a bar could wait on the lock the interrupted code holds)."""
    bars = _open_progress_bars()
    if not bars:
        return text
    if not close_bars:
        return "\n" + text
    for bar in bars:
        bar.close()
    return text


def _open_progress_bars() -> list:
    tqdm = sys.modules.get("tqdm")
    instances = getattr(getattr(tqdm, "tqdm", None), "_instances", None)
    return list(instances) if instances else []


def _keep_exit_handlers_from_importing() -> None:
    """Keep an uncaught Ctrl+C's exit status 130 (the process ended by SIGINT, what a shell and a scheduler read).
    Importing `tabulate` (its `wcwidth` extension) after the interrupt makes CPython 3.11 exit with status 1 instead,
    and torch._dynamo's exit handler (`dump_compile_times`) imports it when it is installed; during this shutdown
    that import fails instead, and the handler formats its (unshown) report with its own plain-text fallback."""
    if "torch._dynamo" in sys.modules and "tabulate" not in sys.modules:
        sys.modules["tabulate"] = None  # `import tabulate` raises ImportError from here on


def _install_quiet_excepthook() -> None:
    previous = sys.excepthook
    if getattr(previous, "hf_lightning_quiet", False):
        return

    def quiet_reported_interrupt(kind, value, traceback):
        if isinstance(value, KeyboardInterrupt):
            _keep_exit_handlers_from_importing()
        reported = isinstance(value, KeyboardInterrupt) and value.__dict__.get("hf_lightning_reported", False)
        if reported and os.environ.get(FULL_TRACEBACK_ENV, "") not in ("1", "true", "True"):
            print(f"KeyboardInterrupt (the traceback is left out; {FULL_TRACEBACK_ENV}=1 shows it)", file=sys.stderr)
            return
        previous(kind, value, traceback)

    quiet_reported_interrupt.hf_lightning_quiet = True
    sys.excepthook = quiet_reported_interrupt
