"""Run as one of two `srun` tasks (SLURM_* variables set by the test, Lightning's SLURMEnvironment with auto-requeue):
train; `REQUEUE_SIGNAL_AT=<rank>` makes that task receive SIGUSR1 (the scheduler's warning) at the named point
`step:2`. A task that finishes dumps the step train() returned at and its weights."""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from hf_lightning.checkpoint.fault_points import KILL_AT_ENV, KILL_SIGNAL_ENV  # noqa: E402
from tests.models import DropoutMLP, regression_data  # noqa: E402


def main(out_dir: str) -> None:
    from hf_lightning import Trainer, TrainingArguments

    rank = int(os.environ["SLURM_PROCID"])
    if os.environ.get("REQUEUE_SIGNAL_AT") == str(rank):
        os.environ[KILL_AT_ENV], os.environ[KILL_SIGNAL_ENV] = "step:2", "SIGUSR1"
    args = TrainingArguments(
        output_dir=os.path.join(out_dir, "run"), use_cpu=True, report_to="none", disable_tqdm=True,
        per_device_train_batch_size=2, max_steps=8, save_strategy="no", logging_steps=1, ddp_backend="gloo",
    )
    trainer = Trainer(model=DropoutMLP(0), args=args, train_dataset=regression_data(16))
    output = trainer.train()
    weights = {name: value.tolist() for name, value in trainer.model.state_dict().items()}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump({"global_step": output.global_step, "weights": weights}, handle)


if __name__ == "__main__":
    from tests.distributed.teardown import end_worker

    main(sys.argv[1])
    end_worker()
