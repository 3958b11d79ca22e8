"""Run under `torch.distributed.run --nproc_per_node=2`: the run guard on 2 processes (gloo). `ours` trains with a
bad window on rank 0 only (NaN labels, or labels that make the loss explode) under `skip` and under `rollback`; `reference` trains on the order that lacks
that window's batches on both ranks. Each rank pickles the final weights and events to
`<out_dir>/<side>_rank<R>.pkl` (tests/engine/test_run_guard_distributed.py)."""

from __future__ import annotations

import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch.utils.data import Sampler  # noqa: E402

from hf_lightning import RunGuard, Trainer, TrainingArguments  # noqa: E402
from tests.distributed.launching import write_rank_report  # noqa: E402
from tests.models import DropoutMLP, ListDataset, regression_data  # noqa: E402

BATCH, GA, WORLD, WINDOW = 2, 2, 2, 4
N = WORLD * 10 * GA * BATCH
# Rank r's micro-batch p is global batch p * WORLD + r; the bad window is update WINDOW + 1 (0-based WINDOW).
POSITIONS = range(WINDOW * GA, (WINDOW + 1) * GA)
BAD = [i for p in POSITIONS for i in range(p * WORLD * BATCH, p * WORLD * BATCH + BATCH)]  # rank 0's batches only
LEFT_OUT = [i for p in POSITIONS for i in range(p * WORLD * BATCH, (p + 1) * WORLD * BATCH)]  # both ranks'


class OrderSampler(Sampler):
    def __init__(self, order: list[int]) -> None:
        self.order = order

    def __iter__(self):
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)


def train(side: str, out_dir: str, action: str | None, kind: str = "nan") -> dict:
    items = [dict(item) for item in regression_data(N).items]
    for index in BAD:
        items[index]["labels"] = torch.tensor(math.nan if kind == "nan" else 1e4)
    order = [i for i in range(N) if i not in LEFT_OUT] if action is None else list(range(N))

    class Ordered(Trainer):
        def _get_train_sampler(self, train_dataset=None):
            return OrderSampler(order)

    args = TrainingArguments(
        output_dir=os.path.join(out_dir, f"{side}-{action}-{kind}"), report_to="none", disable_tqdm=True, seed=0,
        per_device_train_batch_size=BATCH, gradient_accumulation_steps=GA, max_steps=8, learning_rate=0.05,
        logging_steps=2, save_steps=2, lr_scheduler_type="linear",
    )  # fmt: skip
    guard = None if action is None else RunGuard(action, window=4, warmup=2, rtol=50.0)
    trainer = Ordered(model=DropoutMLP(seed=0), args=args, train_dataset=ListDataset(items),
                      callbacks=[] if guard is None else [guard])  # fmt: skip
    trainer.train()
    return {
        "weights": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
        "events": [] if guard is None else guard.events,
        "global_step": trainer.state.global_step,
    }


def main() -> None:
    side, out_dir = sys.argv[1], sys.argv[2]
    runs = [(None, "nan")] if side == "reference" else [(a, k) for a in ("skip", "rollback") for k in ("nan", "explode")]
    write_rank_report(out_dir, side, {f"{action}-{kind}": train(side, out_dir, action, kind) for action, kind in runs})


if __name__ == "__main__":
    main()
