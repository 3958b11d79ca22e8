"""The `eval` workload: evaluate() and predict() throughput (samples/s) on the `cls` model.

Runners: a hand-written `torch.no_grad()` loop (the baseline), transformers.Trainer and hf_lightning.
Every runner first runs one untimed forward so one-off kernel set-up is outside the timed calls; the
first evaluate() and predict() are then timed as a user sees them. eval_loss is the agreement check.
"""

from __future__ import annotations

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


def _timed(call: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = call()
    return result, time.perf_counter() - start


def _result(samples: int, eval_s: float, predict_s: float, eval_loss: float, acc: float) -> dict[str, Any]:
    return {
        "samples": samples,
        "evaluate_s": eval_s,
        "predict_s": predict_s,
        "evaluate_samples_per_s": samples / eval_s,
        "predict_samples_per_s": samples / predict_s,
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

    (eval_loss, acc), eval_s = _timed(evaluate)
    _, predict_s = _timed(loop)
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
    metrics, eval_s = _timed(trainer.evaluate)
    _, predict_s = _timed(lambda: trainer.predict(dataset))
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
