"""Count host syncs per non-logging optimizer step of an hf_lightning (or transformers.Trainer) run.

    python benchmarks/host_syncs.py                      # hf_lightning, tiny workload
    python benchmarks/host_syncs.py --runner transformers --workload clm --scale smoke

Wraps `Tensor.item/.tolist/.numpy/.cpu` and `float()/int()/bool()/index` on tensors for the whole run,
but counts only inside windows that contain no logging, evaluation, saving or epoch boundary: from
`on_step_end` of a step k that does not log to `on_step_end` of step k+1 (so the window holds step k's
post-step flow, the loop's bookkeeping between updates and the whole of step k+1). On a GPU each of these
calls waits for the device; here, on CPU, they are counted by where they are called from.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from benchmarks.workloads import build_workload  # noqa: E402

SYNC_METHODS = ("item", "tolist", "numpy", "cpu", "__float__", "__int__", "__bool__", "__index__")
_OWNERS = ("hf_lightning", "lightning", "transformers", "accelerate", "torch", "benchmarks")


def _where(frame: traceback.FrameSummary) -> str:
    path = frame.filename
    for owner in _OWNERS:
        marker = f"{os.sep}{owner}{os.sep}"
        if marker in path:
            return f"{owner}/{path.rsplit(marker, 1)[1]}:{frame.lineno} {frame.name}"
    return f"{os.path.basename(path)}:{frame.lineno} {frame.name}"


class SyncCounter:
    """Patches torch.Tensor's host-sync methods; counts calls (by kind and call site) while `active`."""

    def __init__(self) -> None:
        self.active = False
        self.windows = 0
        self.kinds: Counter[str] = Counter()
        self.sites: Counter[str] = Counter()
        self._originals: dict[str, Any] = {}
        self._inside = False

    def _wrap(self, name: str, original):
        counter = self

        def wrapper(tensor, *args, **kwargs):
            if counter.active and not counter._inside:
                counter._inside = True  # a sync method calling another counts once
                try:
                    counter._record(name)
                    return original(tensor, *args, **kwargs)
                finally:
                    counter._inside = False
            return original(tensor, *args, **kwargs)

        return wrapper

    def _record(self, name: str) -> None:
        stack = traceback.extract_stack(sys._getframe(2), limit=30)[::-1]  # innermost first
        site = _where(stack[0])
        # The first frame outside torch says which library asked for the value.
        owner = next((_where(f) for f in stack if f"{os.sep}torch{os.sep}" not in f.filename), site)
        self.kinds[name] += 1
        self.sites[f"{name:<9} {site}" + (f"  <- {owner}" if owner != site else "")] += 1

    def install(self) -> None:
        for name in SYNC_METHODS:
            # Remember whether torch.Tensor itself defines it (else it is inherited from TensorBase).
            self._originals[name] = vars(torch.Tensor).get(name)
            setattr(torch.Tensor, name, self._wrap(name, getattr(torch.Tensor, name)))

    def uninstall(self) -> None:
        """Put torch.Tensor back exactly as it was."""
        for name, original in self._originals.items():
            if original is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)
        self._originals.clear()

    def summary(self) -> dict[str, Any]:
        per_step = max(self.windows, 1)
        return {
            "windows": self.windows,
            "syncs_per_step": sum(self.kinds.values()) / per_step,
            "by_kind_per_step": {k: v / per_step for k, v in self.kinds.most_common()},
            "by_site_per_step": {k: v / per_step for k, v in self.sites.most_common(25)},
        }


def count_host_syncs(runner: str, workload_name: str, scale: str, steps: int | None = None) -> dict[str, Any]:
    """Train `workload_name` with `runner` ("hf_lightning" or "transformers") and count syncs per quiet step."""
    if runner == "hf_lightning":
        from hf_lightning import Trainer, TrainerCallback, TrainingArguments
    elif runner == "transformers":
        from transformers import Trainer, TrainerCallback, TrainingArguments
    else:
        raise ValueError(f"runner={runner!r}: choose hf_lightning or transformers")
    workload = build_workload(workload_name, scale, steps)
    updates_per_epoch = workload.num_examples // (workload.batch_size * workload.grad_accum)
    counter = SyncCounter()

    class Windows(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            step = state.global_step
            if counter.active:
                counter.active = False
                counter.windows += 1
            quiet_after = step % args.logging_steps != 0 and step % updates_per_epoch != 0
            counter.active = quiet_after and step < workload.max_steps

    with tempfile.TemporaryDirectory() as output_dir:
        trainer = Trainer(
            model=workload.seeded_model(),
            args=TrainingArguments(**workload.trainer_args(output_dir)),
            train_dataset=workload.train_dataset(),
            callbacks=[Windows()],
        )
        counter.install()
        try:
            trainer.train()
        finally:
            counter.uninstall()
    return {
        "runner": runner,
        "workload": workload_name,
        "scale": scale,
        "steps": workload.max_steps,
        **counter.summary(),
    }


def format_summary(result: dict[str, Any]) -> str:
    lines = [
        f"{result['runner']} / {result['workload']} ({result['scale']}, {result['steps']} steps): "
        f"{result['syncs_per_step']:.2f} host syncs per non-logging step over {result['windows']} steps",
    ]
    lines += [f"  {kind:<10} {count:6.2f}/step" for kind, count in result["by_kind_per_step"].items()]
    lines.append("  where:")
    lines += [f"  {count:6.2f}/step  {site}" for site, count in result["by_site_per_step"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runner", default="hf_lightning", choices=("hf_lightning", "transformers"))
    parser.add_argument("--workload", default="tiny", choices=("tiny", "cls", "clm"))
    parser.add_argument("--scale", default="quick", choices=("full", "quick", "smoke"))
    parser.add_argument("--steps", type=int, help="override the workload's max_steps")
    parser.add_argument("--out", help="also write the result as JSON")
    options = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    result = count_host_syncs(options.runner, options.workload, options.scale, options.steps)
    print(format_summary(result))
    if options.out:
        Path(options.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
