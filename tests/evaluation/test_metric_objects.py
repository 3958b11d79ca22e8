"""torchmetrics objects as `compute_metrics` (evaluation/metric_objects.py): the values equal the reference
Trainer's with an equivalent numpy `compute_metrics` on the same tiny model, data and seed; states reset between
evaluations; evaluate() gathers no predictions, and eval_accumulation_steps changes no value; best-model selection
and early stopping read the values; the arguments without meaning for a metric object are refused.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
import transformers
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score
from torchmetrics.regression import MeanAbsoluteError, MeanSquaredError, PearsonCorrCoef

from hf_lightning import EarlyStoppingCallback, Trainer, TrainingArguments
from hf_lightning.evaluation.metric_objects import local_rows_to_keep
from tests.models import (
    classification_data,
    make_regression_mlp,
    make_tiny_bert_classifier,
    make_tiny_bert_token_classifier,
    pad_token_batch,
    regression_data,
    token_classification_data,
)
from tests.parity.harness import assert_metrics_match, assert_predictions_equal, run_parity

BASE = {"use_cpu": True, "report_to": "none", "disable_tqdm": True, "per_device_eval_batch_size": 4}


def numpy_classification(eval_prediction):
    """The reference side: accuracy and macro F1 over every gathered prediction."""
    predictions = np.argmax(eval_prediction.predictions, axis=-1)
    labels = eval_prediction.label_ids
    f1s = []
    for cls in range(2):
        tp = np.sum((predictions == cls) & (labels == cls))
        fp = np.sum((predictions == cls) & (labels != cls))
        fn = np.sum((predictions != cls) & (labels == cls))
        f1s.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return {"accuracy": float((predictions == labels).mean()), "f1": float(np.mean(f1s))}


def classification_metrics():
    return {"accuracy": MulticlassAccuracy(2, average="micro"), "f1": MulticlassF1Score(2, average="macro")}


def steps(*actions):
    return lambda trainer: [action(trainer) for action in actions]


def test_classification_values_equal_the_reference_twice_and_predict_returns_predictions(tmp_path):
    """Two evaluate() calls (states reset between them) and predict(): the reference's values and predictions."""
    eval_data = classification_data(10, seed=1)
    result = run_parity(
        make_tiny_bert_classifier(),
        None,
        tmp_path,
        reference_trainer_kwargs={"compute_metrics": numpy_classification},
        our_trainer_kwargs={"compute_metrics": classification_metrics()},
        run=steps(
            lambda t: t.evaluate(eval_data), lambda t: t.evaluate(eval_data), lambda t: t.predict(eval_data)
        ),
        per_device_eval_batch_size=4,
    )
    first, second, predicted = result.ours.output
    ref_first, ref_second, ref_predicted = result.reference.output
    assert_metrics_match(first, ref_first)
    assert_metrics_match(second, ref_second)
    assert {k: v for k, v in first.items() if "runtime" not in k and "per_second" not in k} == {
        k: v for k, v in second.items() if "runtime" not in k and "per_second" not in k
    }
    # Not a trivial value: the untrained model gets some samples wrong and F1 differs from accuracy.
    assert 0 < first["eval_accuracy"] < 1 and first["eval_f1"] != first["eval_accuracy"]
    assert predicted.predictions.shape == (10, 2)
    assert_predictions_equal(predicted, ref_predicted)


def test_token_classification_with_minus_100_labels_and_preprocessed_logits(tmp_path):
    """Variable-length batches: labels reach the metric with their -100 padding (its ignore_index decides) and
    the predictions are what `preprocess_logits_for_metrics` returns."""
    eval_data = token_classification_data()

    def argmax(logits, labels):
        return logits.argmax(-1)

    def numpy_token_accuracy(eval_prediction):
        labels, predictions = eval_prediction.label_ids, eval_prediction.predictions
        real = labels != -100
        return {"token_accuracy": float((predictions[real] == labels[real]).mean())}

    result = run_parity(
        make_tiny_bert_token_classifier(),
        None,
        tmp_path,
        trainer_kwargs={"data_collator": pad_token_batch, "preprocess_logits_for_metrics": argmax},
        reference_trainer_kwargs={"compute_metrics": numpy_token_accuracy},
        our_trainer_kwargs={
            "compute_metrics": MetricCollection(
                {"token_accuracy": MulticlassAccuracy(3, average="micro", ignore_index=-100)}
            )
        },
        run=steps(lambda t: t.evaluate(eval_data), lambda t: t.predict(eval_data)),
        per_device_eval_batch_size=3,
    )
    (ours, predicted), (ref, ref_predicted) = result.ours.output, result.reference.output
    assert_metrics_match(ours, ref)
    assert 0 < ours["eval_token_accuracy"] < 1
    assert_predictions_equal(predicted, ref_predicted)


def test_regression_values_equal_the_reference(tmp_path):
    eval_data = regression_data(10, seed=1)

    def numpy_regression(eval_prediction):
        errors = eval_prediction.predictions - eval_prediction.label_ids
        pearson = np.corrcoef(eval_prediction.predictions, eval_prediction.label_ids)[0, 1]
        return {
            "mse": float((errors**2).mean()),
            "mae": float(np.abs(errors).mean()),
            "pearson": float(pearson),
        }

    # A plain dict keeps its order (a MetricCollection would sort the names).
    ours_metrics = {"mse": MeanSquaredError(), "mae": MeanAbsoluteError(), "pearson": PearsonCorrCoef()}
    result = run_parity(
        make_regression_mlp(),
        None,
        tmp_path,
        reference_trainer_kwargs={"compute_metrics": numpy_regression},
        our_trainer_kwargs={"compute_metrics": ours_metrics},
        run=lambda t: t.evaluate(eval_data),
        per_device_eval_batch_size=4,
    )
    assert_metrics_match(result.ours.output, result.reference.output, atol=1e-5)
    assert result.ours.output["eval_mse"] > 0


def test_best_model_and_early_stopping_read_a_torchmetrics_value(tmp_path):
    """metric_for_best_model="accuracy" from a MulticlassAccuracy: the same best checkpoint, best metric, eval
    history and early stop as the reference with numpy accuracy."""
    eval_data = classification_data(10, seed=1)

    def numpy_accuracy(eval_prediction):
        return {
            "accuracy": float((eval_prediction.predictions.argmax(-1) == eval_prediction.label_ids).mean())
        }

    result = run_parity(
        make_tiny_bert_classifier(),
        classification_data(24),
        tmp_path,
        trainer_kwargs={"eval_dataset": eval_data},
        reference_trainer_kwargs={
            "compute_metrics": numpy_accuracy,
            "callbacks": [transformers.EarlyStoppingCallback(early_stopping_patience=2)],
        },
        our_trainer_kwargs={
            "compute_metrics": {"accuracy": MulticlassAccuracy(2, average="micro")},
            "callbacks": [EarlyStoppingCallback(early_stopping_patience=2)],
        },
        run=lambda t: (t.train(), t.state),
        per_device_train_batch_size=4,
        learning_rate=2e-2,
        num_train_epochs=3,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        load_best_model_at_end=True,
        metric_for_best_model="accuracy",
        per_device_eval_batch_size=4,
    )
    (_, ours), (_, ref) = result.ours.output, result.reference.output
    ours_history = [entry["eval_accuracy"] for entry in ours.log_history if "eval_loss" in entry]
    ref_history = [entry["eval_accuracy"] for entry in ref.log_history if "eval_loss" in entry]
    assert ours_history == pytest.approx(ref_history, abs=1e-6) and len(set(ours_history)) > 1
    # Early stopping ended both runs at the same step, before the 18 planned.
    assert ours.global_step == ref.global_step < 18
    assert math.isclose(ours.best_metric, ref.best_metric, abs_tol=1e-6)
    assert os.path.basename(ours.best_model_checkpoint) == os.path.basename(ref.best_model_checkpoint)


def test_best_model_selection_names_the_reported_key(tmp_path):
    """With a bare Metric, metric_for_best_model names its reported key (the class name); trained weights of
    the best checkpoint are the ones loaded at the end."""
    args = TrainingArguments(
        output_dir=str(tmp_path),
        **BASE,
        per_device_train_batch_size=4,
        learning_rate=2e-2,
        max_steps=4,
        eval_strategy="steps",
        eval_steps=1,
        save_strategy="steps",
        save_steps=1,
        load_best_model_at_end=True,
        metric_for_best_model="MulticlassAccuracy",
    )
    trainer = Trainer(
        model=make_tiny_bert_classifier(),
        args=args,
        train_dataset=classification_data(24),
        eval_dataset=classification_data(10, seed=1),
        compute_metrics=MulticlassAccuracy(2, average="micro"),
    )
    trainer.train()
    history = [e["eval_MulticlassAccuracy"] for e in trainer.state.log_history if "eval_loss" in e]
    best_step = 1 + int(np.argmax(history))
    assert trainer.state.best_metric == max(history)
    assert trainer.state.best_model_checkpoint.endswith(f"checkpoint-{best_step}")
    assert trainer.evaluate()["eval_MulticlassAccuracy"] == max(history)


def _trainer(tmp_path, compute_metrics, **kwargs):
    return Trainer(
        model=make_tiny_bert_classifier(),
        args=TrainingArguments(output_dir=str(tmp_path), **BASE, **kwargs),
        compute_metrics=compute_metrics,
    )


def test_evaluate_gathers_only_the_loss_and_predict_gathers_predictions(tmp_path):
    trainer = _trainer(tmp_path, classification_metrics(), eval_accumulation_steps=1)
    gathered = []
    original = trainer._gather_for_metrics

    def spy(data, is_loss=False):
        gathered.append(is_loss)
        return original(data, is_loss=is_loss)

    trainer._gather_for_metrics = spy
    data = classification_data(10, seed=1)
    metrics = trainer.evaluate(data)
    assert gathered == [True, True, True] and "eval_accuracy" in metrics
    gathered.clear()
    predicted = trainer.predict(data)
    # Per batch: the loss, the predictions and the labels, offloaded every step (eval_accumulation_steps=1).
    assert gathered == [True, False, False] * 3
    assert predicted.predictions.shape == (10, 2) and predicted.label_ids.shape == (10,)
    assert predicted.metrics["test_accuracy"] == metrics["eval_accuracy"]


def _timeless(metrics):
    """Without the wall-clock values (`*_runtime`, `*_per_second`, `*_model_preparation_time`)."""
    return {
        k: v for k, v in metrics.items() if not any(w in k for w in ("runtime", "per_second", "preparation"))
    }


def test_eval_accumulation_steps_changes_no_value(tmp_path):
    """With a metric object evaluate() offloads only its losses: the metric values and eval_loss are those without
    eval_accumulation_steps; predict() offloads its predictions as with a callable, to the same arrays."""
    data = classification_data(10, seed=1)
    plain = _trainer(tmp_path / "plain", classification_metrics())
    offloading = _trainer(tmp_path / "offloading", classification_metrics(), eval_accumulation_steps=1)
    gathered = []
    original = offloading._gather_for_metrics

    def spy(data, is_loss=False):
        gathered.append(is_loss)
        return original(data, is_loss=is_loss)

    offloading._gather_for_metrics = spy
    expected = _timeless(plain.evaluate(data))
    assert _timeless(offloading.evaluate(data)) == expected and 0 < expected["eval_accuracy"] < 1
    assert gathered == [True, True, True]  # one loss per batch kept (and offloaded), nothing else
    predicted, reference = offloading.predict(data), plain.predict(data)
    assert _timeless(predicted.metrics) == _timeless(reference.metrics)
    np.testing.assert_array_equal(predicted.predictions, reference.predictions)
    np.testing.assert_array_equal(predicted.label_ids, reference.label_ids)


class RowsAndDict(Metric):
    """Counts the rows it sees and computes a dict (reported under its keys)."""

    def __init__(self) -> None:
        super().__init__()
        self.add_state("rows", default=torch.tensor(0), dist_reduce_fx="sum")
        self.add_state("correct", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, predictions: torch.Tensor, labels: torch.Tensor) -> None:
        self.rows += labels.shape[0]
        self.correct += (predictions.argmax(-1) == labels).sum()

    def compute(self) -> dict[str, torch.Tensor]:
        return {"rows": self.rows, "correct": self.correct}


def test_a_bare_metric_is_reported_under_its_class_name_or_its_dict_keys(tmp_path):
    data = classification_data(10, seed=1)
    metrics = _trainer(tmp_path, MulticlassAccuracy(2, average="micro")).evaluate(data)
    assert "eval_MulticlassAccuracy" in metrics and isinstance(metrics["eval_MulticlassAccuracy"], float)
    metrics = _trainer(tmp_path, RowsAndDict()).evaluate(data)
    assert metrics["eval_rows"] == 10.0 and isinstance(metrics["eval_correct"], float)


def test_an_interrupted_evaluation_leaves_no_state_behind(tmp_path):
    """A failure in the middle of an evaluation: the next one starts from a clean state (reset before update)."""
    metric = RowsAndDict()
    trainer = _trainer(tmp_path, metric)
    data = classification_data(10, seed=1)
    original = trainer.prediction_step
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("interrupted")
        return original(*args, **kwargs)

    trainer.prediction_step = failing
    with pytest.raises(RuntimeError, match="interrupted"):
        trainer.evaluate(data)
    assert int(metric.rows) == 4
    trainer.prediction_step = original
    assert trainer.evaluate(data)["eval_rows"] == 10.0
    # Reset after compute, too.
    assert int(metric.rows) == 0


def test_a_value_with_several_elements_is_an_error_naming_the_key(tmp_path):
    trainer = _trainer(tmp_path, {"per_class": MulticlassAccuracy(2, average=None)})
    with pytest.raises(ValueError, match=r"'per_class' has shape \(2,\).*ClasswiseWrapper"):
        trainer.evaluate(classification_data(10, seed=1))


def test_arguments_without_meaning_for_a_metric_object_are_refused(tmp_path):
    with pytest.raises(ValueError, match="batch_eval_metrics=True with a torchmetrics object"):
        _trainer(tmp_path, classification_metrics(), batch_eval_metrics=True)
    with pytest.raises(ValueError, match=r"include_for_metrics=\['inputs'\] with a torchmetrics object"):
        _trainer(tmp_path, MulticlassAccuracy(2), include_for_metrics=["inputs"])
    # Assigned after construction: refused when the evaluation starts.
    trainer = _trainer(tmp_path, None, include_for_metrics=["loss"])
    trainer.compute_metrics = MulticlassAccuracy(2)
    with pytest.raises(ValueError, match="include_for_metrics"):
        trainer.evaluate(classification_data(4))
    with pytest.raises(ValueError, match="include_for_metrics"):
        trainer.predict(classification_data(4))
    trainer = _trainer(tmp_path, None, batch_eval_metrics=True)
    trainer.compute_metrics = {"accuracy": MulticlassAccuracy(2)}
    with pytest.raises(ValueError, match="batch_eval_metrics=True with a torchmetrics object"):
        trainer.evaluate(classification_data(4))
    with pytest.raises(ValueError, match="batch_eval_metrics=True with a torchmetrics object"):
        trainer.predict(classification_data(4))
    with pytest.raises(ValueError, match=r"compute_metrics\['f1'\] is a function, not a torchmetrics Metric"):
        _trainer(tmp_path, {"accuracy": MulticlassAccuracy(2), "f1": numpy_classification})


@pytest.mark.parametrize(
    ("rows", "last", "remainder", "rank", "kept"),
    [(4, False, 5, 1, 4), (4, True, 0, 1, 4), (4, True, -1, 0, 4), (4, True, 5, 0, 4), (4, True, 5, 1, 1),
     (4, True, 3, 1, 0), (3, True, 3, 0, 3)],
)  # fmt: skip
def test_local_rows_to_keep(rows, last, remainder, rank, kept):
    """Rank r keeps its share of the gathered last round's first `remainder` rows."""
    assert local_rows_to_keep(rows, last, remainder, rank) == kept


def _decode(row) -> str:
    """The small decode step of the generation test: token ids as words, without pad (0), EOS (1) and -100."""
    return " ".join(str(token) for token in row if token > 1)


class BatchShapes(Metric):
    """Records the shapes and padding of what each update receives."""

    def __init__(self) -> None:
        super().__init__()
        self.add_state("calls", default=torch.tensor(0), dist_reduce_fx="sum")
        self.seen: list[tuple] = []

    def update(self, predictions: torch.Tensor, labels: torch.Tensor) -> None:
        self.calls += 1
        self.seen.append((tuple(predictions.shape), tuple(labels.shape), bool((labels == -100).any())))

    def compute(self) -> torch.Tensor:
        return self.calls


def test_generation_feeds_generated_ids_to_a_text_metric_through_a_decode_step(tmp_path):
    """predict_with_generate: the metric receives what prediction_step returns per batch (generated ids padded
    with the pad id to the generation width, labels likewise, the collator's -100 kept); a word error rate over
    decoded ids equals the reference's numpy decode of the gathered predictions."""
    from torchmetrics.functional.text import word_error_rate
    from torchmetrics.text import WordErrorRate
    from torchmetrics.wrappers import LambdaInputTransformer

    from hf_lightning import Seq2SeqTrainer, Seq2SeqTrainingArguments
    from tests.models import make_tiny_t5, pad_seq2seq_batch, seq2seq_data

    def decode_batch(ids: torch.Tensor) -> list[str]:
        return [_decode(row) for row in ids.tolist()]

    def numpy_wer(eval_prediction):
        predictions = [_decode(row) for row in eval_prediction.predictions.tolist()]
        references = [_decode(row) for row in eval_prediction.label_ids.tolist()]
        return {"wer": float(word_error_rate(predictions, references))}

    shapes = BatchShapes()
    ours_metrics = {
        "wer": LambdaInputTransformer(
            WordErrorRate(), transform_pred=decode_batch, transform_target=decode_batch
        ),
        "batches": shapes,
    }
    data = seq2seq_data(5)
    result = run_parity(
        make_tiny_t5(),
        None,
        tmp_path,
        reference_trainer_cls=transformers.Seq2SeqTrainer,
        our_trainer_cls=Seq2SeqTrainer,
        reference_args_cls=transformers.Seq2SeqTrainingArguments,
        our_args_cls=Seq2SeqTrainingArguments,
        trainer_kwargs={"data_collator": pad_seq2seq_batch},
        reference_trainer_kwargs={"compute_metrics": numpy_wer},
        our_trainer_kwargs={"compute_metrics": ours_metrics},
        run=lambda t: t.evaluate(data),
        predict_with_generate=True,
        per_device_eval_batch_size=2,
    )
    ours, ref = result.ours.output, result.reference.output
    assert abs(ours["eval_wer"] - ref["eval_wer"]) < 1e-6 and ours["eval_wer"] > 0
    assert ours["eval_loss"] == ref["eval_loss"]
    assert ours["eval_batches"] == 3.0
    # Batches of 2, 2 and 1: generated ids at least the generation config's max_length (20) wide (shorter ones
    # padded with the pad id), labels (at most 3 tokens) padded to 20, the collator's -100 kept where a label is
    # shorter than its batch's longest.
    assert [(seen[0][0], seen[1]) for seen in shapes.seen] == [(2, (2, 20)), (2, (2, 20)), (1, (1, 20))]
    assert all(seen[0][1] >= 20 for seen in shapes.seen)
    assert any(seen[2] for seen in shapes.seen)


def test_a_metric_object_is_refused_in_a_tensor_parallel_run_before_training(tmp_path, monkeypatch):
    """Metric states synced over the tensor-parallel ranks would count each sample tp_size times: refused when
    the Trainer is built (naming parallelism_config.tp_size), not at the first evaluation mid-training. A
    one-process stand-in: the run reports tp_size=2, and the model's plan check is left out (BERT has none)."""
    import hf_lightning.strategies.tensor_parallel.plans as plans

    monkeypatch.setattr(plans, "tp_model_refusal", lambda model, tp_size: None)
    monkeypatch.setattr(Trainer, "get_tp_size", lambda self: 2)
    with pytest.raises(ValueError, match=r"metric objects with parallelism_config.tp_size=2 is not supported"):
        _trainer(tmp_path, classification_metrics())
    # A callable compute_metrics is accepted, and a metric object assigned later is refused when evaluation starts.
    trainer = _trainer(tmp_path, numpy_classification)
    trainer.compute_metrics = MulticlassAccuracy(2)
    monkeypatch.setattr(trainer, "_data_parallel_layout", lambda: (1, 0))
    with pytest.raises(ValueError, match=r"parallelism_config.tp_size=2"):
        trainer.evaluate(classification_data(4))
