"""Run under `torch.distributed.run --nproc_per_node=2`: train with enable_jit_checkpoint while only rank 1 receives
SIGTERM (at the named point `step:2`); each rank dumps the step train() returned at and the checkpoint's files.
`SIGTERM_PLAN=staggered`: rank 0 receives it at `step:2` and rank 1 at `step:3` (a scheduler signalling each process
in turn); `JIT=0`: without enable_jit_checkpoint (every process then ends by the signal, as the reference's)."""

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

    rank = int(os.environ["RANK"])
    points = {1: "step:2"} if os.environ.get("SIGTERM_PLAN", "one") == "one" else {0: "step:2", 1: "step:3"}
    if rank in points:
        os.environ[KILL_AT_ENV], os.environ[KILL_SIGNAL_ENV] = points[rank], "SIGTERM"
    args = TrainingArguments(
        output_dir=os.path.join(out_dir, "run"), use_cpu=True, report_to="none", disable_tqdm=True,
        per_device_train_batch_size=2, max_steps=8, save_strategy="no", logging_steps=1, ddp_backend="gloo",
        enable_jit_checkpoint=os.environ.get("JIT", "1") == "1",
    )
    output = Trainer(model=DropoutMLP(0), args=args, train_dataset=regression_data(16)).train()
    folders = {
        name: sorted(os.listdir(os.path.join(args.output_dir, name)))
        for name in sorted(os.listdir(args.output_dir))
        if name.startswith("checkpoint-")
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump({"global_step": output.global_step, "checkpoints": folders}, handle)


if __name__ == "__main__":
    from tests.distributed.teardown import end_worker

    main(sys.argv[1])
    end_worker()
