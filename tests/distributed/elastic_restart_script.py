"""Run under `torchrun --nproc_per_node=2 --max-restarts=1`: a plain script that calls `train()` without resuming.
With `KILL_AT_STEP=N`, rank 1 of the first attempt kills itself (SIGKILL) after update N; the elastic agent then
restarts both workers. Each rank of each attempt writes what it did to `<out>/attempt<A>_rank<R>.json`."""

from __future__ import annotations

import json
import os
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from tests.models import DropoutMLP, regression_data  # noqa: E402

MAX_STEPS, SAVE_STEPS = 12, 4


def main(out_dir: str) -> None:
    from hf_lightning import Trainer, TrainingArguments
    from hf_lightning.callbacks import TrainerCallback

    torch.set_num_threads(1)
    attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
    kill_at = int(os.environ.get("KILL_AT_STEP", "0"))
    report = {"steps_run": 0}
    path = os.path.join(out_dir, f"attempt{attempt}_rank{rank}.json")

    class Record(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            report["steps_run"] += 1
            with open(path, "w") as handle:
                json.dump(report, handle)
            if state.global_step == kill_at and rank == "1" and attempt == "0":
                os.kill(os.getpid(), signal.SIGKILL)

    args = TrainingArguments(
        output_dir=os.path.join(out_dir, "run"), use_cpu=True, report_to="none", disable_tqdm=True, seed=3,
        max_steps=MAX_STEPS, save_steps=SAVE_STEPS, per_device_train_batch_size=2, logging_steps=1,
        learning_rate=1e-2, ddp_backend="gloo",
    )  # fmt: skip
    trainer = Trainer(model=DropoutMLP(0), args=args, train_dataset=regression_data(64), callbacks=[Record()])
    output = trainer.train()
    report.update(
        global_step=output.global_step,
        losses=[entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        weights={name: tensor.tolist() for name, tensor in trainer.model.state_dict().items()},
    )
    with open(path, "w") as handle:
        json.dump(report, handle)


if __name__ == "__main__":
    main(sys.argv[1])
