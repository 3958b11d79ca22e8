"""Run under `torch.distributed.run --nproc_per_node=2`: a callback reads the announced checkpoint in `on_save` on
every rank, with synchronous and background writes; the saving rank is slowed before its commit so a rank that
announced early would find no folder (or the previous one). Each rank pickles what its callback saw."""

from __future__ import annotations

import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.distributed.launching import write_rank_report  # noqa: E402
from tests.models import make_regression_mlp, regression_data  # noqa: E402

COMMIT_DELAY_S = 0.5


def _checkpoint_reader(callback_base):
    class ReadOnSave(callback_base):
        """Reads `checkpoint-<state.global_step>` in `on_save`, as Ray's report callback and uploaders do."""

        def __init__(self):
            self.steps_ended = 0
            self.seen = []

        def on_step_end(self, args, state, control, **kwargs):
            self.steps_ended += 1

        def on_save(self, args, state, control, **kwargs):
            import json

            from hf_lightning.checkpoint.files import checkpoint_problem, get_last_checkpoint

            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            saved_step = None
            if os.path.isfile(os.path.join(folder, "trainer_state.json")):
                with open(os.path.join(folder, "trainer_state.json")) as handle:
                    saved_step = json.load(handle)["global_step"]
            self.seen.append(
                {
                    "step": state.global_step,
                    "after_steps": self.steps_ended,
                    "problem": checkpoint_problem(folder),
                    "saved_step": saved_step,
                    "last": os.path.basename(get_last_checkpoint(args.output_dir) or ""),
                }
            )

    return ReadOnSave()


def _slow_commit(point: str) -> None:
    if point == "marker" and int(os.environ.get("RANK", "0")) == 0:
        time.sleep(COMMIT_DELAY_S)


def main(side: str, out_dir: str) -> None:
    from hf_lightning import Trainer, TrainingArguments
    from hf_lightning.callbacks import TrainerCallback
    from hf_lightning.checkpoint.fault_points import fault_hook

    report = {}
    for mode in ("sync", "async"):
        callback = _checkpoint_reader(TrainerCallback)
        args = TrainingArguments(
            output_dir=os.path.join(out_dir, side, mode), use_cpu=True, report_to="none", disable_tqdm=True,
            per_device_train_batch_size=2, max_steps=6, save_steps=2, logging_steps=1, ddp_backend="gloo",
        )  # fmt: skip
        trainer = Trainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(24), callbacks=[callback])
        if mode == "async":
            from lightning.pytorch.plugins.io import AsyncCheckpointIO

            trainer.lightning_trainer_overrides = {"plugins": [AsyncCheckpointIO()]}
        with fault_hook(_slow_commit):
            trainer.train()
        report[mode] = callback.seen
    write_rank_report(out_dir, side, report)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
