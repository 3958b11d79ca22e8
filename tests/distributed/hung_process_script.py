"""Run under `torchrun --nproc_per_node=2`: process `HANG_RANK` stops making progress after update 5 (it sleeps far
past `ddp_timeout`); the others wait for it in the next update's collective."""

from __future__ import annotations

import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.models import make_regression_mlp, regression_data  # noqa: E402


def main(out_dir: str) -> None:
    import torch

    from hf_lightning import Trainer, TrainingArguments
    from hf_lightning.callbacks import TrainerCallback

    torch.set_num_threads(1)

    class Hang(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 5 and os.environ["RANK"] == os.environ["HANG_RANK"]:
                time.sleep(600)

    args = TrainingArguments(
        output_dir=out_dir, use_cpu=True, report_to="none", disable_tqdm=True, max_steps=10, save_steps=4,
        per_device_train_batch_size=2, ddp_backend="gloo", ddp_timeout=int(os.environ["DDP_TIMEOUT"]),
    )  # fmt: skip
    Trainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(64), callbacks=[Hang()]).train()


if __name__ == "__main__":
    main(sys.argv[1])
