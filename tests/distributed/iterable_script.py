"""Run under `torch.distributed.run --nproc_per_node=2`: train on IterableDatasets with the reference
(`reference`) or hf_lightning (`ours`); each rank pickles, per scenario, the examples its model saw in order, the
epochs the dataset was told, rank 0's log history and the final weights to `<out_dir>/<side>_rank<R>.pkl`
(tests/data/test_iterable_across_processes.py)."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import IterableDataset  # noqa: E402

NUM_EXAMPLES = 21  # batches of 2 on 2 processes: 5 whole global batches and a tail of 1 example per epoch


class Examples(IterableDataset):
    """`NUM_EXAMPLES` regression examples with their index, in an order that depends on the epoch it is told."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(NUM_EXAMPLES, 4, generator=generator)
        self.y = self.x.sum(-1) * 0.5
        self.epoch = 0
        self.epochs_told: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.epochs_told.append(epoch)

    def __iter__(self):
        order = torch.randperm(NUM_EXAMPLES, generator=torch.Generator().manual_seed(self.epoch)).tolist()
        for index in order:
            yield {"x": self.x[index], "labels": self.y[index], "idx": torch.tensor(index)}


class NoisyCollator:
    """Stacks the examples and adds noise from the global RNG: where and when batches are collated shows."""

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        batch = {key: torch.stack([f[key] for f in features]) for key in features[0]}
        batch["x"] = batch["x"] + 0.01 * torch.randn(batch["x"].shape)
        return batch


class RecordingMLP(nn.Module):
    """An MLP with dropout that records the example indices of each forward; in evaluation it adds noise from the
    global RNG, so when batches are collated against the forwards shows there too."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Dropout(0.1), nn.Linear(16, 1))
        self.seen: list[list[int]] = []

    def forward(self, x, labels=None, idx=None):
        if self.training and idx is not None:
            self.seen.append(idx.tolist())
        logits = self.net(x).squeeze(-1)
        if not self.training:
            logits = logits + 0.01 * torch.rand(logits.shape)
        return {"loss": nn.functional.mse_loss(logits, labels), "logits": logits}


class SizedExamples(Examples):
    """`Examples` with a length: the reference counts the updates of an epoch from it."""

    def __len__(self) -> int:
        return NUM_EXAMPLES


class RankSeededExamples(Examples):
    """`Examples` shuffled with its own `generator`, seeded differently on each rank: the reference sets every rank's
    generator to rank 0's state when an iteration starts (accelerate's `synchronized_generator`)."""

    def __init__(self) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(100 + int(os.environ.get("RANK", "0")))

    def __iter__(self):
        for index in torch.randperm(NUM_EXAMPLES, generator=self.generator).tolist():
            yield {"x": self.x[index], "labels": self.y[index], "idx": torch.tensor(index)}


class FailingExamples(Examples):
    """`Examples` whose iteration fails at the 7th example: only rank 0 reads it when batches are dealt."""

    def __iter__(self):
        for number, example in enumerate(super().__iter__()):
            if number == 6:
                raise OSError("the stream broke at example 7")
            yield example


def hf_stream():
    """An HF datasets stream of the first 20 examples in 2 shards of 10 (even and odd indices), so each of the 2
    processes can keep its own shard and both make the same number of steps."""
    from datasets import IterableDataset as StreamDataset

    data = Examples()

    def generate(shards):
        for shard in shards:
            for index in range(shard, 20, 2):
                yield {"x": data.x[index].tolist(), "labels": float(data.y[index]), "idx": index}

    return StreamDataset.from_generator(generate, gen_kwargs={"shards": [0, 1]}).with_format("torch")


SCENARIOS = {
    # The default for an iterable dataset: rank 0 reads, joins 2 batches, deals the halves; the tail is completed.
    "dispatched": ({}, 2, Examples),
    "dispatched_split": ({"accelerator_config": {"split_batches": True}}, 4, Examples),
    # Every rank reads the dataset and keeps its part of each global batch.
    "each_reads": ({"accelerator_config": {"dispatch_batches": False}}, 2, Examples),
    "each_reads_split": ({"accelerator_config": {"dispatch_batches": False, "split_batches": True}}, 4, Examples),
    # An HF datasets stream with enough shards: each rank keeps its own shards.
    "stream_by_shard": ({"accelerator_config": {"dispatch_batches": False}}, 2, hf_stream),
    "stream_dispatched": ({}, 2, hf_stream),
    # With a length: the epochs' updates come from the dealt loader's length (GA 2: windows across the tail).
    "sized_dispatched": ({"max_steps": -1, "num_train_epochs": 2, "gradient_accumulation_steps": 2}, 2, SizedExamples),
    "sized_dispatched_split": ({"max_steps": -1, "num_train_epochs": 2, "accelerator_config": {"split_batches": True}}, 4, SizedExamples),
    "generator_each_reads": ({"accelerator_config": {"dispatch_batches": False}}, 2, RankSeededExamples),
}


def classes(side: str):
    if side == "reference":
        import transformers

        return transformers.Trainer, transformers.TrainingArguments
    from hf_lightning import Trainer, TrainingArguments

    return Trainer, TrainingArguments


def train(side: str, out_dir: str, name: str, extra: dict, batch_size: int, make_data, resume: str | None = None):
    trainer_cls, args_cls = classes(side)
    dataset = make_data()
    model = RecordingMLP()
    kwargs = dict(
        output_dir=os.path.join(out_dir, side, name), use_cpu=True, report_to="none", disable_tqdm=True,
        per_device_train_batch_size=batch_size, max_steps=14, logging_steps=1, learning_rate=1e-2, seed=7,
        ddp_backend="gloo", save_strategy="steps" if name == "dispatched" else "no", save_steps=4,
    )  # fmt: skip
    args = args_cls(**{**kwargs, **extra})
    trainer = trainer_cls(model=model, args=args, train_dataset=dataset, data_collator=NoisyCollator())
    trainer.train(resume_from_checkpoint=resume)
    weights = {k: v.detach().to(torch.float64).flatten().tolist() for k, v in trainer.model.state_dict().items()}
    return {
        "max_steps": trainer.state.max_steps,
        "seen": model.seen,
        "epochs_told": sorted(set(getattr(dataset, "epochs_told", []))),
        "log_history": [
            {k: v for k, v in entry.items() if k in ("loss", "grad_norm", "learning_rate", "epoch", "step")}
            for entry in trainer.state.log_history
        ],
        "weights": weights,
    }


def example_metrics(prediction) -> dict:
    """Metrics that change with any sample added, dropped or moved: how many, their sum, and an order-weighted sum."""
    import numpy as np

    predictions, labels = np.asarray(prediction.predictions), np.asarray(prediction.label_ids)
    weights = np.arange(1, len(labels) + 1)
    return {"count": len(labels), "label_sum": float(labels.sum()), "ordered": float((weights * predictions).sum())}


def evaluated(side: str, out_dir: str, name: str, extra: dict, make_data) -> dict:
    """A training run that evaluates an iterable eval dataset every 7 steps, then evaluate() and predict() of it
    (eval batch 2: the last joined batch holds 1 example)."""
    trainer_cls, args_cls = classes(side)
    kwargs = dict(
        output_dir=os.path.join(out_dir, side, name), use_cpu=True, report_to="none", disable_tqdm=True,
        per_device_train_batch_size=2, per_device_eval_batch_size=2, max_steps=14, logging_steps=7,
        eval_strategy="steps", eval_steps=7, learning_rate=1e-2, seed=7, ddp_backend="gloo", save_strategy="no",
    )  # fmt: skip
    trainer = trainer_cls(
        model=RecordingMLP(), args=args_cls(**{**kwargs, **extra}), train_dataset=make_data(),
        eval_dataset=make_data(), data_collator=NoisyCollator(), compute_metrics=example_metrics,
    )  # fmt: skip
    trainer.train()
    metrics = trainer.evaluate()
    prediction = trainer.predict(make_data())
    return {
        "evaluate": {k: v for k, v in metrics.items() if not k.endswith(("_runtime", "_per_second", "_time"))},
        "predictions": prediction.predictions.tolist(),
        "label_ids": prediction.label_ids.tolist(),
        "predict_metrics": {k: v for k, v in prediction.metrics.items() if not k.endswith(("_runtime", "_per_second", "_time"))},
        "train_log": [
            {k: v for k, v in entry.items() if k in ("loss", "grad_norm", "learning_rate", "step")}
            for entry in trainer.state.log_history
            if "loss" in entry
        ],
        "train_evaluations": [
            {k: v for k, v in entry.items() if not k.endswith(("_runtime", "_per_second", "_time"))}
            for entry in trainer.state.log_history
            if "eval_loss" in entry
        ],
    }


EVALUATIONS = {
    "evaluated_dispatched": ({}, Examples),
    "evaluated_each_reads": ({"accelerator_config": {"dispatch_batches": False}}, Examples),
    "evaluated_sized_dispatched": ({}, SizedExamples),
}


def listed_examples():
    """The `Examples` as a map-style dataset."""
    from tests.models import ListDataset

    data = Examples()
    return ListDataset([{"x": data.x[i], "labels": data.y[i], "idx": torch.tensor(i)} for i in range(NUM_EXAMPLES)])


def evaluate_then_train(side: str, out_dir: str) -> dict:
    """evaluate() before train() on map-style data: whether training then synchronises the ranks' gradients."""
    trainer_cls, args_cls = classes(side)
    args = args_cls(
        output_dir=os.path.join(out_dir, side, "evaluate_then_train"), use_cpu=True, report_to="none",
        disable_tqdm=True, per_device_train_batch_size=2, per_device_eval_batch_size=2, max_steps=3,
        learning_rate=1e-2, seed=7, ddp_backend="gloo", save_strategy="no",
    )  # fmt: skip
    trainer = trainer_cls(
        model=RecordingMLP(), args=args, train_dataset=listed_examples(), eval_dataset=listed_examples(),
        data_collator=NoisyCollator(),
    )  # fmt: skip
    trainer.evaluate()
    trainer.train()
    return {
        "wrapped": type(trainer.model_wrapped).__name__,
        "weights": {k: v.detach().to(torch.float64).flatten().tolist() for k, v in trainer.model.state_dict().items()},
    }


def report(side: str, out_dir: str) -> dict:
    results = {"evaluate_then_train": evaluate_then_train(side, out_dir)}
    for name, (extra, make_data) in EVALUATIONS.items():
        results[name] = evaluated(side, out_dir, name, extra, make_data)
    for name, (extra, batch_size, make_data) in SCENARIOS.items():
        results[name] = train(side, out_dir, name, extra, batch_size, make_data)
    # Resume mid-epoch (step 8 of 6-step epochs) from the dispatched run's checkpoint: the skipped batches replay.
    checkpoint = os.path.join(out_dir, side, "dispatched", "checkpoint-8")
    results["dispatched_resumed"] = train(side, out_dir, "dispatched_resumed", {}, 2, Examples, resume=checkpoint)
    if side == "ours":  # the reference's other ranks would wait in the broadcast until the timeout
        try:
            train(side, out_dir, "failing", {}, 2, FailingExamples)
        except Exception as error:  # what each rank raises when the first one cannot read the next batch
            results["failing_error"] = f"{type(error).__name__}: {error}"
    return results


if __name__ == "__main__":
    side, out_dir = sys.argv[1], sys.argv[2]
    outcome = report(side, out_dir)
    from tests.distributed.launching import write_rank_report
    from tests.distributed.teardown import end_worker

    write_rank_report(out_dir, side, outcome)
    end_worker()
