"""Worker for tests/evaluation/test_distributed_metric_objects.py: torchmetrics objects as compute_metrics.

Run as `python -m torch.distributed.run --nproc_per_node=2 tests/distributed/metrics_eval_script.py <out_dir>`.
Each rank evaluates tests/distributed/eval_script.py's 37 tagging samples twice and predicts them once with
hf_lightning and a dict of torchmetrics objects, and pickles the metrics to `<out_dir>/rank<R>.pkl`. The test
runs `run()` in its own process too, for the single-process values.
"""

from __future__ import annotations

import os
import pickle
import sys

import torch


def make_metrics() -> dict:
    """Token accuracy and macro F1 over real tokens, and the number of sequences seen (exact integer states)."""
    from torchmetrics import Metric
    from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

    class Sequences(Metric):
        """How many sequences updated the metric: each sample must count once."""

        def __init__(self) -> None:
            super().__init__()
            self.add_state("count", default=torch.tensor(0), dist_reduce_fx="sum")

        def update(self, predictions: torch.Tensor, labels: torch.Tensor) -> None:
            self.count += labels.shape[0]

        def compute(self) -> torch.Tensor:
            return self.count

    return {
        "token_accuracy": MulticlassAccuracy(3, average="micro", ignore_index=-100),
        "token_f1": MulticlassF1Score(3, average="macro", ignore_index=-100),
        "sequences": Sequences(),
    }


def run(output_dir: str) -> dict:
    """evaluate() twice and predict() once with a Trainer, then evaluate() with a Seq2SeqTrainer."""
    from hf_lightning import Seq2SeqTrainer, Seq2SeqTrainingArguments, Trainer, TrainingArguments
    from tests.distributed.eval_script import EVAL_BATCH_SIZE, TaggingData, make_model, pad_collate

    common = {"use_cpu": True, "per_device_eval_batch_size": EVAL_BATCH_SIZE, "report_to": "none"}
    data = TaggingData()

    def argmax(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return logits.argmax(-1)

    trainer = Trainer(
        model=make_model(),
        args=TrainingArguments(output_dir=os.path.join(output_dir, "trainer"), **common),
        data_collator=pad_collate,
        compute_metrics=make_metrics(),
        preprocess_logits_for_metrics=argmax,
    )
    result = {"world_size": trainer.args.world_size}
    result["eval_metrics"] = [trainer.evaluate(data), trainer.evaluate(data)]
    predicted = trainer.predict(data)
    result["test_metrics"], result["predictions"] = predicted.metrics, predicted.predictions
    seq2seq = Seq2SeqTrainer(
        model=make_model(),
        args=Seq2SeqTrainingArguments(output_dir=os.path.join(output_dir, "seq2seq"), **common),
        data_collator=pad_collate,
        compute_metrics=make_metrics(),
        preprocess_logits_for_metrics=argmax,
    )
    result["seq2seq_eval_metrics"] = seq2seq.evaluate(data)
    return result


def main() -> None:
    output_dir = sys.argv[1]
    result = run(output_dir)
    rank = int(os.environ.get("RANK", "0"))
    with open(os.path.join(output_dir, f"rank{rank}.pkl"), "wb") as handle:
        pickle.dump(result, handle)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from tests.distributed.teardown import end_worker

    main()
    end_worker()
