"""Run by `torchrun --nnodes=1:2 --nproc_per_node=1 --max-restarts=1` on each of two simulated nodes (two agents at
one c10d rendezvous): a plain script that calls `train()` without resuming, with
`HF_LIGHTNING_KEEP_GLOBAL_BATCH=1`. With `LOSE_NODE_AT_STEP=N`, the second node is lost after update N of the first
attempt (its worker kills its agent, then itself); the surviving agent restarts with one node. Each rank of each
attempt writes what it did to `<out>/attempt<A>_rank<R>.json`."""

from __future__ import annotations

import json
import os
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from tests.models import make_regression_mlp, regression_data  # noqa: E402


def main(out_dir: str) -> None:
    from hf_lightning import Trainer, TrainingArguments
    from hf_lightning.callbacks import TrainerCallback

    torch.set_num_threads(1)
    attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
    lose_at = int(os.environ.get("LOSE_NODE_AT_STEP", "0"))
    report = {"steps_run": 0, "world_size": int(os.environ["WORLD_SIZE"])}
    path = os.path.join(out_dir, f"attempt{attempt}_rank{rank}.json")

    class Record(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            report["steps_run"] += 1
            with open(path, "w") as handle:
                json.dump(report, handle)
            if state.global_step == lose_at and rank == "1" and attempt == "0":
                os.kill(os.getppid(), signal.SIGKILL)  # the node's agent: the whole node is gone
                os.kill(os.getpid(), signal.SIGKILL)

    args = TrainingArguments(
        output_dir=os.path.join(out_dir, "run"), use_cpu=True, report_to="none", disable_tqdm=True, seed=3,
        max_steps=12, save_steps=4, per_device_train_batch_size=2, logging_steps=1, learning_rate=1e-2,
        ddp_backend="gloo",
    )  # fmt: skip
    trainer = Trainer(model=make_regression_mlp(0), args=args, train_dataset=regression_data(64), callbacks=[Record()])
    output = trainer.train()
    report.update(
        global_step=output.global_step,
        gradient_accumulation_steps=trainer.args.gradient_accumulation_steps,
        losses={entry["step"]: entry["loss"] for entry in trainer.state.log_history if "loss" in entry},
        weights={name: tensor.tolist() for name, tensor in trainer.model.state_dict().items()},
    )
    with open(path, "w") as handle:
        json.dump(report, handle)


if __name__ == "__main__":
    from tests.distributed.teardown import end_worker

    main(sys.argv[1])
    end_worker()
