"""A run that survives a bad batch: `RunGuard` rolls back past a batch whose labels make the loss NaN.

A small regression task with one corrupt batch (NaN labels) at update 13. With `--action rollback` (the default
here) the guard sees the NaN at the next training log, reloads the newest checkpoint written before it, leaves the
batch out and finishes the run; `--action skip` decides at the same log and goes back to the state it kept in
memory at the log before (no checkpoint needed), without the update; `--action stop` saves and ends with
`RunGuardStop`. Run: `python examples/run_guard.py --output_dir out`.
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn
from torch.utils.data import Dataset

from hf_lightning import RunGuard, Trainer, TrainingArguments

BATCH, BAD_UPDATE = 4, 13


class Regression(Dataset):
    """y = sum(x) / 2 with noise; the examples of update `BAD_UPDATE` (in a sequential order) have NaN labels."""

    def __init__(self, n: int = 256) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=generator)
        self.y = self.x.sum(-1) / 2 + 0.05 * torch.randn(n, generator=generator)
        self.y[(BAD_UPDATE - 1) * BATCH : BAD_UPDATE * BATCH] = math.nan

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict:
        return {"x": self.x[index], "labels": self.y[index]}


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, x, labels=None):
        prediction = self.net(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(prediction, labels), "logits": prediction}


class InOrder(Trainer):
    def _get_train_sampler(self, train_dataset=None):
        return torch.utils.data.SequentialSampler(self.train_dataset)  # the bad batch lands at a known update


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--output_dir", default="run_guard_output")
    parser.add_argument("--action", default="rollback", choices=["rollback", "skip", "stop"])
    cli = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    args = TrainingArguments(
        output_dir=cli.output_dir, per_device_train_batch_size=BATCH, max_steps=40, learning_rate=0.05,
        logging_steps=5, save_steps=5, report_to="none", disable_tqdm=True, use_cpu=True,
    )  # fmt: skip
    guard = RunGuard(cli.action, window=10, rtol=10.0)
    trainer = InOrder(model=Regressor(), args=args, train_dataset=Regression(), callbacks=[guard])
    output = trainer.train()
    print(output)
    print(f"events: {guard.events}")
    print(f"final loss {trainer.state.log_history[-2]['loss']:.4f} (finite: the bad batch never reached the weights)")


if __name__ == "__main__":
    main()
