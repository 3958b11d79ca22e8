"""Run under `torch.distributed.run --nproc_per_node=2`: the run guard on 2 processes (gloo), `<side> <out_dir>
[ddp|fsdp]`. `ours` trains with a bad window on rank 0 only (NaN labels, or labels that make the loss explode);
`reference` trains on the order that lacks that window's batches on both ranks. Each rank pickles its report to
`<out_dir>/<side>_rank<R>.pkl` (tests/engine/test_run_guard_distributed.py).
- ddp: `skip` and `rollback` against our run on the shorter order.
- fsdp (CPU): `rollback`, `stop` and `skip` (refused) under FSDP2 (full state dict files) and FSDP1 (sharded
  files), and our unguarded FSDP1 run on the shorter order; the reference is transformers.Trainer on the shorter
  order (on CPU it runs the FSDP arguments as DDP). Weights are gathered onto rank 0 under FSDP.
"""

from __future__ import annotations

import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch.utils.data import Sampler  # noqa: E402

from hf_lightning import RunGuard, RunGuardStop, Trainer, TrainingArguments  # noqa: E402
from tests.distributed.launching import checkpoint_listing, write_rank_report  # noqa: E402
from tests.models import DropoutMLP, ListDataset, regression_data  # noqa: E402

BATCH, GA, WORLD, WINDOW = 2, 2, 2, 4
N = WORLD * 10 * GA * BATCH
# Rank r's micro-batch p is global batch p * WORLD + r; the bad window is update WINDOW + 1 (0-based WINDOW).
POSITIONS = range(WINDOW * GA, (WINDOW + 1) * GA)
BAD = [i for p in POSITIONS for i in range(p * WORLD * BATCH, p * WORLD * BATCH + BATCH)]  # rank 0's batches only
LEFT_OUT = [i for p in POSITIONS for i in range(p * WORLD * BATCH, (p + 1) * WORLD * BATCH)]  # both ranks'
# FSDP on CPU (gloo), one unit (the MLP has no layer classes to wrap).
FSDP = {
    "fsdp2": {"fsdp": True, "fsdp_config": {"version": 2}},
    "fsdp1": {"fsdp": True, "fsdp_config": {"version": 1, "state_dict_type": "SHARDED_STATE_DICT"}},
}


class OrderSampler(Sampler):
    def __init__(self, order: list[int]) -> None:
        self.order = order

    def __iter__(self):
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)


def train(side: str, out_dir: str, action: str | None, kind: str = "nan", fsdp: str | None = None,
          save_steps: int = 2) -> dict:  # fmt: skip
    items = [dict(item) for item in regression_data(N).items]
    for index in BAD:
        items[index]["labels"] = torch.tensor(math.nan if kind == "nan" else 1e4)
    order = [i for i in range(N) if i not in LEFT_OUT] if action is None else list(range(N))
    reference = side == "reference" and fsdp is not None  # transformers.Trainer itself
    if reference:
        import transformers  # lazy: only the FSDP reference launch runs the reference's own Trainer

        base, arguments = transformers.Trainer, transformers.TrainingArguments
    else:
        base, arguments = Trainer, TrainingArguments

    class Ordered(base):
        def _get_train_sampler(self, train_dataset=None):
            return OrderSampler(order)

    output_dir = os.path.join(out_dir, f"{side}-{fsdp}-{action}-{kind}")
    extra = {} if fsdp is None else dict(use_cpu=True, ddp_backend="gloo", **FSDP[fsdp])
    args = arguments(
        output_dir=output_dir, report_to="none", disable_tqdm=True, seed=0,
        per_device_train_batch_size=BATCH, gradient_accumulation_steps=GA, max_steps=8, learning_rate=0.05,
        logging_steps=2, save_steps=save_steps, lr_scheduler_type="linear", **extra,
    )  # fmt: skip
    guard = None if action is None else RunGuard(action, window=4, warmup=2, rtol=50.0)
    trainer = Ordered(model=DropoutMLP(seed=0), args=args, train_dataset=ListDataset(items),
                      callbacks=[] if guard is None else [guard])  # fmt: skip
    try:
        trainer.train()
    except (RunGuardStop, ValueError) as error:  # stop, or skip refused before training
        return {"error": f"{type(error).__name__}: {error}", "events": guard.events, "global_step": trainer.state.global_step,
                "checkpoints": checkpoint_listing(output_dir)}  # fmt: skip
    return {
        "weights": _weights(trainer, fsdp, reference),
        "events": [] if guard is None else guard.events,
        "global_step": trainer.state.global_step,
        "strategy": None if reference else type(trainer.lightning_trainer.strategy).__name__,
    }


def _weights(trainer, fsdp: str | None, reference: bool) -> dict:
    """The whole model's weights (under our FSDP gathered onto rank 0: empty on the others)."""
    if fsdp is not None and not reference:
        from hf_lightning.strategies.fsdp.checkpoint import gather_full_state_dict  # lazy: FSDP launches only

        state = gather_full_state_dict(trainer.model_wrapped)
    else:
        state = trainer.model.state_dict()
    return {k: v.detach().clone() for k, v in state.items()}


def main() -> None:
    side, out_dir = sys.argv[1], sys.argv[2]
    strategy = sys.argv[3] if len(sys.argv) > 3 else "ddp"
    if strategy == "ddp":
        runs = (
            [(None, "nan")]
            if side == "reference"
            else [(a, k) for a in ("skip", "rollback") for k in ("nan", "explode")]
        )
        report = {f"{action}-{kind}": train(side, out_dir, action, kind) for action, kind in runs}
    elif side == "reference":
        report = {"fsdp2-None": train(side, out_dir, None, fsdp="fsdp2")}
    else:
        report = {f"{fsdp}-{action}": train(side, out_dir, action, fsdp=fsdp, save_steps=4 if action == "stop" else 2)
                  for fsdp in ("fsdp2", "fsdp1") for action in ("rollback", "stop", "skip")}  # fmt: skip
        # FSDP1 does not round as DDP does (see the test): its own run on the shorter order, compared bit for bit.
        report["fsdp1-None"] = train(side, out_dir, None, fsdp="fsdp1")
    write_rank_report(out_dir, side, report)


if __name__ == "__main__":
    from tests.distributed.teardown import end_worker

    main()
    end_worker()
