"""The `eval` workload: evaluate() and predict() throughput (samples/s) on the `cls` model.

Runners: a hand-written `torch.no_grad()` loop (the baseline), transformers.Trainer and hf_lightning.
Every runner first runs one untimed forward so one-off kernel set-up is outside the timed calls; then
`eval_rounds` rounds of evaluate() and predict() are timed, and samples/s is taken from the median round (the
first round, as a user first sees it, is kept as `first_evaluate_s` / `first_predict_s`). eval_loss is the
agreement check.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from benchmarks.timing import StepClock
from benchmarks.workloads import SEED, Workload, stack_collate


def _eval_dataset(workload: Workload):
    return workload.build_dataset(workload.extra["eval_samples"], SEED + 2)


def accuracy(eval_prediction) -> dict[str, float]:
    """compute_metrics: arg-max accuracy (works with either library's EvalPrediction)."""
    logits, labels = eval_prediction.predictions, eval_prediction.label_ids
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


def _warm_up(model: torch.nn.Module, dataset, batch_size: int) -> None:
    with torch.no_grad():
        model.eval()
        model(**stack_collate([dataset[i] for i in range(min(batch_size, len(dataset)))]))


def _timed_rounds(
    workload: Workload, evaluate: Callable[[], Any], predict: Callable[[], Any]
) -> tuple[Any, list[float], list[float]]:
    """`eval_rounds` rounds of evaluate() then predict(): the first evaluate()'s result and each call's seconds."""
    first_result, evaluate_s, predict_s = None, [], []
    for _ in range(workload.extra["eval_rounds"]):
        start = time.perf_counter()
        result = evaluate()
        evaluate_s.append(time.perf_counter() - start)
        first_result = result if first_result is None else first_result
        start = time.perf_counter()
        predict()
        predict_s.append(time.perf_counter() - start)
    return first_result, evaluate_s, predict_s


def _result(
    samples: int, evaluate_s: list[float], predict_s: list[float], eval_loss: float, acc: float
) -> dict[str, Any]:
    eval_median, predict_median = statistics.median(evaluate_s), statistics.median(predict_s)
    return {
        "samples": samples,
        "rounds": len(evaluate_s),
        "first_evaluate_s": evaluate_s[0],
        "first_predict_s": predict_s[0],
        "evaluate_s": eval_median,
        "predict_s": predict_median,
        "evaluate_samples_per_s": samples / eval_median,
        "predict_samples_per_s": samples / predict_median,
        "eval_loss": eval_loss,
        "accuracy": acc,
    }


def run_hand_eval(workload: Workload, clock: StepClock, output_dir: str) -> dict[str, Any]:
    """Batches through the model under no_grad; losses weighted by batch size, logits concatenated."""
    clock.imports_done()
    model = workload.seeded_model()
    dataset = _eval_dataset(workload)
    _warm_up(model, dataset, workload.eval_batch_size)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=workload.eval_batch_size, collate_fn=stack_collate
    )

    def loop() -> tuple[float, np.ndarray, np.ndarray]:
        model.eval()
        losses, logits, labels = [], [], []
        with torch.no_grad():
            for batch in loader:
                output = model(**batch)
                losses.append(output["loss"].repeat(len(batch["labels"])))
                logits.append(output["logits"])
                labels.append(batch["labels"])
        all_logits, all_labels = torch.cat(logits).numpy(), torch.cat(labels).numpy()
        return float(torch.cat(losses).mean()), all_logits, all_labels

    def evaluate() -> tuple[float, float]:
        loss, logits, labels = loop()
        return loss, float((np.argmax(logits, axis=-1) == labels).mean())

    (eval_loss, acc), eval_s, predict_s = _timed_rounds(workload, evaluate, loop)
    return _result(len(dataset), eval_s, predict_s, eval_loss, acc)


def _run_hf_style_eval(
    workload: Workload, output_dir: str, trainer_cls: type, args_cls: type
) -> dict[str, Any]:
    model = workload.seeded_model()
    dataset = _eval_dataset(workload)
    _warm_up(model, dataset, workload.eval_batch_size)
    args = args_cls(
        output_dir=output_dir,
        per_device_eval_batch_size=workload.eval_batch_size,
        report_to="none",
        disable_tqdm=True,
        dataloader_pin_memory=False,
        seed=SEED,
    )
    trainer = trainer_cls(model=model, args=args, eval_dataset=dataset, compute_metrics=accuracy)
    metrics, eval_s, predict_s = _timed_rounds(workload, trainer.evaluate, lambda: trainer.predict(dataset))
    return _result(len(dataset), eval_s, predict_s, metrics["eval_loss"], metrics["eval_accuracy"])


def run_transformers_eval(workload: Workload, clock: StepClock, output_dir: str) -> dict[str, Any]:
    from transformers import Trainer, TrainingArguments

    clock.imports_done()
    return _run_hf_style_eval(workload, output_dir, Trainer, TrainingArguments)


def run_hf_lightning_eval(workload: Workload, clock: StepClock, output_dir: str) -> dict[str, Any]:
    from hf_lightning import Trainer, TrainingArguments

    clock.imports_done()
    return _run_hf_style_eval(workload, output_dir, Trainer, TrainingArguments)


EVAL_RUNNERS: dict[str, Callable[[Workload, StepClock, str], dict[str, Any]]] = {
    "hand": run_hand_eval,
    "transformers": run_transformers_eval,
    "hf_lightning": run_hf_lightning_eval,
}
