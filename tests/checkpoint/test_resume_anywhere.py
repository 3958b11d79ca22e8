"""A run SIGKILLed at any forward pass and resumed with `resume_from_checkpoint=True` continues exactly.

Each case trains straight once, then, for kill points drawn with a fixed seed, trains from scratch in a forked child
of this (already imported) process that SIGKILLs itself inside its k-th forward pass (anywhere: inside an
accumulation window, after an epoch boundary past the last checkpoint, in a later pass over an iterable dataset),
and resumes from the newest checkpoint in this process with a fresh dataset and a differently initialised model.
The resumed run must see the uninterrupted run's batches in its order and end with its per-step losses, learning
rates and grad norms, and its weights bit for bit. Cases: map-style data, a torch IterableDataset with the Stateful
protocol, HF datasets streams read from local JSON files with and without a shuffle buffer, each with 0 and 2
loader workers, and a collator that draws random numbers.
"""

from __future__ import annotations

import json
import os
import random
import signal

import datasets
import pytest
import torch

from hf_lightning import TrainingArguments
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.checkpoint.forked_kill import run_in_killed_child
from tests.models import DropoutMLP, regression_data

ITEMS = 12  # batch 2: 6 micro-batches per pass; accumulation 2: 3 updates per pass
SETTINGS = dict(
    use_cpu=True,
    report_to="none",
    disable_tqdm=True,
    per_device_train_batch_size=2,
    gradient_accumulation_steps=2,
    max_steps=10,  # 20 micro-batches: three passes and a third over the data
    save_steps=2,
    logging_steps=1,
    learning_rate=1e-2,
    seed=123,
)
FORWARDS = SETTINGS["max_steps"] * SETTINGS["gradient_accumulation_steps"]
CHILD_TIMEOUT_S = 120


class SeenBatches(DropoutMLP):
    """DropoutMLP that records the first feature of every batch it sees, and SIGKILLs its own process inside its
    `kill_at`-th forward pass (a kill with no warning, mid-step)."""

    def __init__(self, seed: int = 0, kill_at: int | None = None):
        super().__init__(seed)
        self.kill_at = kill_at
        self.forwards = 0
        self.seen: list[list[float]] = []

    def forward(self, x, labels=None):
        self.forwards += 1
        if self.training:
            self.seen.append(x[:, 0].tolist())
        if self.kill_at is not None and self.forwards == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().forward(x, labels)


class StatefulStream(torch.utils.data.IterableDataset):
    """Items in order with torch's Stateful protocol, dealt across loader workers; a loaded state applies to the
    next iteration only."""

    def __init__(self, items):
        self.items = items
        self.next_index = 0
        self.start = 0

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        start, self.start = self.start, 0
        for index in range(start, len(self.items)):
            self.next_index = index + 1
            if index % workers == worker:
                yield self.items[index]

    def state_dict(self):
        return {"next_index": self.next_index}

    def load_state_dict(self, state):
        self.start = state["next_index"]


def masking_collator(features):
    """Stacks the examples and masks inputs at random from torch's global generator (as an MLM collator does)."""
    batch = {key: torch.stack([feature[key] for feature in features]) for key in features[0]}
    batch["x"] = batch["x"] * (torch.rand(batch["x"].shape) > 0.3)
    return batch


def _json_shards(folder) -> list[str]:
    items = regression_data(ITEMS).items
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for shard in range(2):
        path = folder / f"shard-{shard}.jsonl"
        with open(path, "w", encoding="utf-8") as handle:
            for item in items[shard::2]:
                handle.write(json.dumps({"x": item["x"].tolist(), "labels": item["labels"].item()}) + "\n")
        paths.append(str(path))
    return paths


def make_dataset(kind: str, folder):
    if kind in ("map", "map-masking"):
        return regression_data(ITEMS)
    if kind in ("stateful", "stateful-masking"):
        return StatefulStream(regression_data(ITEMS).items)
    stream = datasets.load_dataset("json", data_files=_json_shards(folder), split="train", streaming=True)
    stream = stream.with_format("torch")
    return stream.shuffle(seed=3, buffer_size=4) if kind == "hf-shuffled" else stream


def train(kind: str, output_dir, *, workers: int, resume=None, kill_at=None, model_seed=0) -> HFLightningTrainer:
    model = SeenBatches(model_seed, kill_at)
    trainer = HFLightningTrainer(
        model=model,
        args=TrainingArguments(output_dir=str(output_dir), dataloader_num_workers=workers, **SETTINGS),
        train_dataset=make_dataset(kind, output_dir.parent),
        data_collator=masking_collator if kind.endswith("masking") else None,
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def step_logs(trainer) -> list[dict]:
    return [
        {k: v for k, v in entry.items() if not k.endswith(("_runtime", "_per_second"))}
        for entry in trainer.state.log_history
        if "train_loss" not in entry
    ]


def killed_child(kind: str, run_dir, *, workers: int, kill_at: int) -> int:
    """Train from scratch in a forked child that SIGKILLs itself in forward pass `kill_at`; its wait status."""
    return run_in_killed_child(
        lambda: train(kind, run_dir, workers=workers, kill_at=kill_at),
        timeout_s=CHILD_TIMEOUT_S,
        what=f"forward {kill_at}",
    )


def kill_points(case: str) -> list[int]:
    """Forward passes to kill at, drawn with a seed fixed per case: one with an epoch boundary between the last
    checkpoint and the kill (checkpoints every 4 forwards, passes of 6), one inside an accumulation window (the
    window's second forward, its first one trained on) past the first pass."""
    rng = random.Random(f"resume-anywhere:{case}")
    across_epoch = rng.choice([7, 8, 19, 20])  # checkpoint at forward 4 / 16, pass ends at 6 / 18
    in_window = rng.choice(range(10, FORWARDS + 1, 2))
    return sorted({across_epoch, in_window})


CASES = [
    (kind, workers)
    for kind in ("map", "stateful", "hf-stream", "hf-shuffled", "map-masking", "stateful-masking")
    for workers in (0, 2)
]


@pytest.mark.slow
@pytest.mark.parametrize("kind, workers", CASES, ids=[f"{kind}-{workers}w" for kind, workers in CASES])
def test_a_run_killed_anywhere_resumes_exactly(tmp_path, kind, workers):
    straight = train(kind, tmp_path / "straight" / "run", workers=workers)
    expected_seen = straight.model.seen
    assert straight.state.global_step == SETTINGS["max_steps"]
    for kill_at in kill_points(f"{kind}-{workers}"):
        run_dir = tmp_path / f"killed-{kill_at}" / "run"
        status = killed_child(kind, run_dir, workers=workers, kill_at=kill_at)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"forward {kill_at} not reached"
        resumed = train(kind, run_dir, workers=workers, resume=True, model_seed=7)
        start = len(expected_seen) - len(resumed.model.seen)
        checkpoint_step = SETTINGS["save_steps"] * ((kill_at - 1) // (2 * SETTINGS["save_steps"]))
        assert start == checkpoint_step * SETTINGS["gradient_accumulation_steps"], kill_at
        assert resumed.model.seen == expected_seen[start:], kill_at
        assert step_logs(resumed) == step_logs(straight), kill_at
        weights, expected = resumed.model.state_dict(), straight.model.state_dict()
        assert not [name for name in weights if not torch.equal(weights[name], expected[name])], kill_at
