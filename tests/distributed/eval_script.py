"""Worker for tests/evaluation/test_distributed_eval.py: evaluate() / predict() before any training, on every rank.

Run as `python -m torch.distributed.run --nproc_per_node=2 tests/distributed/eval_script.py <side> <out_dir>`
with side `ours` (hf_lightning) or `reference` (transformers). Each rank pickles what it got to
`<out_dir>/<side>_rank<R>.pkl`: metrics, predictions and labels of `Trainer` and `Seq2SeqTrainer`, and the
dataset indices it read. The model and data are also imported by the test for the single-process run.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

NUM_SAMPLES = 37
EVAL_BATCH_SIZE = 4
VOCAB, NUM_TAGS = 32, 3


class Tagger(nn.Module):
    """Per-token tag logits `(batch, length, 3)`: the width of a batch follows its longest sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, 8)
        self.head = nn.Linear(8, NUM_TAGS)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.head(torch.tanh(self.embedding(input_ids)))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(
                logits.flatten(0, 1), labels.flatten(), ignore_index=-100
            )
        return out


class TaggingData(Dataset):
    """37 sequences of lengths 2..9; records which indices this process read (its share of the data)."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        lengths = torch.randint(2, 10, (NUM_SAMPLES,), generator=generator).tolist()
        self.items = [
            {
                "input_ids": torch.randint(1, VOCAB, (n,), generator=generator),
                "labels": torch.randint(0, NUM_TAGS, (n,), generator=generator),
            }
            for n in lengths
        ]
        self.read: list[int] = []

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        self.read.append(index)
        return self.items[index]


def pad_collate(features: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pad ids with 0 and labels with -100 to the batch's longest sequence."""
    width = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), width, dtype=torch.long)
    labels = torch.full((len(features), width), -100, dtype=torch.long)
    for row, feature in enumerate(features):
        ids[row, : len(feature["input_ids"])] = feature["input_ids"]
        labels[row, : len(feature["labels"])] = feature["labels"]
    return {"input_ids": ids, "labels": labels}


def token_accuracy(eval_prediction) -> dict[str, float]:
    predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
    mask = labels != -100
    return {
        "token_accuracy": float((predictions.argmax(-1)[mask] == labels[mask]).mean()),
        "rows": len(labels),
    }


def make_model() -> Tagger:
    torch.manual_seed(0)
    return Tagger()


def run(side: str, output_dir: str) -> dict:
    """evaluate() then predict() with Trainer, then evaluate() / predict() with Seq2SeqTrainer."""
    if side == "ours":
        from hf_lightning import Seq2SeqTrainer, Seq2SeqTrainingArguments, Trainer, TrainingArguments
    else:
        from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, Trainer, TrainingArguments

    common = {"use_cpu": True, "per_device_eval_batch_size": EVAL_BATCH_SIZE, "report_to": "none"}
    result: dict = {}
    data = TaggingData()
    trainer = Trainer(
        model=make_model(),
        args=TrainingArguments(output_dir=os.path.join(output_dir, "trainer"), **common),
        data_collator=pad_collate,
        compute_metrics=token_accuracy,
    )
    result["eval_metrics"] = trainer.evaluate(data)
    eval_reads = list(data.read)
    predictions = trainer.predict(data)
    result["predictions"], result["label_ids"] = predictions.predictions, predictions.label_ids
    result["test_metrics"] = predictions.metrics
    result["world_size"] = trainer.args.world_size
    result["eval_reads"] = eval_reads

    seq2seq = Seq2SeqTrainer(
        model=make_model(),
        args=Seq2SeqTrainingArguments(output_dir=os.path.join(output_dir, "seq2seq"), **common),
        data_collator=pad_collate,
    )
    result["seq2seq_eval_metrics"] = seq2seq.evaluate(data)
    seq2seq_predictions = seq2seq.predict(data)
    result["seq2seq_predictions"] = seq2seq_predictions.predictions
    result["seq2seq_label_ids"] = seq2seq_predictions.label_ids
    result["seq2seq_test_loss"] = seq2seq_predictions.metrics.get("test_loss")
    return result


def main() -> None:
    side, output_dir = sys.argv[1], sys.argv[2]
    result = run(side, output_dir)
    result["predictions"] = np.asarray(result["predictions"])
    from tests.distributed.launching import write_rank_report

    write_rank_report(output_dir, side, result)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from tests.distributed.teardown import end_worker

    main()
    end_worker()
