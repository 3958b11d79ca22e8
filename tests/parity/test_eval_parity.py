"""Evaluation, prediction and Seq2Seq generation: `evaluate()` / `predict()` / evaluation during training give
the reference's metrics (to 1e-6; timing keys only present), log history and predictions (exactly).

Each scenario runs once under `transformers.Trainer` (or `Seq2SeqTrainer`) and once under ours, on deep copies
of the same tiny model, through `run_parity` with a `run` that evaluates / trains / predicts in sequence.
"""

from __future__ import annotations

import numpy as np
import pytest
import transformers

from hf_lightning import Seq2SeqTrainer, Seq2SeqTrainingArguments
from tests.models import (
    classification_data,
    make_regression_mlp,
    make_tiny_bert_classifier,
    make_tiny_bert_token_classifier,
    make_tiny_t5,
    pad_seq2seq_batch,
    pad_token_batch,
    regression_data,
    seq2seq_data,
    token_classification_data,
)
from tests.parity.harness import (
    assert_arrays_equal,
    assert_log_history_matches,
    assert_metrics_match,
    assert_predictions_equal,
    run_parity,
)

# Eval batches of 4 over 10 samples: the short last batch exercises the sample weighting of the loss.
EVAL = {"per_device_eval_batch_size": 4}


def accuracy(eval_prediction):
    predictions = np.argmax(eval_prediction.predictions, axis=-1)
    return {"accuracy": float((predictions == eval_prediction.label_ids).mean())}


def token_accuracy(eval_prediction):
    """Accuracy over real tokens: -100 marks padding in both the labels and the padded logits."""
    labels = eval_prediction.label_ids
    predictions = np.argmax(eval_prediction.predictions, axis=-1)
    real = labels != -100
    return {"token_accuracy": float((predictions[real] == labels[real]).mean()), "tokens": int(real.sum())}


def mse(eval_prediction):
    errors = eval_prediction.predictions - eval_prediction.label_ids
    return {"mse": float((errors**2).mean()), "max_error": float(np.abs(errors).max())}


def steps(*actions):
    """A `run` for `run_parity` that calls each `action(trainer)` in turn and returns their results."""
    return lambda trainer: [action(trainer) for action in actions]


def evaluate(trainer, **kwargs):
    return trainer.evaluate(**kwargs)


def train(trainer):
    return trainer.train()


def assert_results_match(result):
    """Every evaluate() / predict() result of `steps(...)` matches; train() outputs compare their step."""
    for ref_output, our_output in zip(result.reference.output, result.ours.output, strict=True):
        if isinstance(ref_output, dict):
            assert_metrics_match(our_output, ref_output)
        elif hasattr(ref_output, "predictions"):
            assert_predictions_equal(our_output, ref_output)
        else:
            assert our_output.global_step == ref_output.global_step


def test_classifier_accuracy_before_and_after_training(tmp_path):
    """compute_metrics accuracy; evaluate() before training (model_preparation_time), after it, and predict()."""
    eval_data = classification_data(10, seed=1)
    result = run_parity(
        make_tiny_bert_classifier(),
        classification_data(12),
        tmp_path,
        trainer_kwargs={"eval_dataset": eval_data, "compute_metrics": accuracy},
        run=steps(evaluate, train, evaluate, lambda t: t.predict(eval_data)),
        per_device_train_batch_size=4,
        learning_rate=5e-3,
        num_train_epochs=2,
        logging_steps=1,
        **EVAL,
    )
    before, _, after, predicted = result.ours.output
    assert list(before) == [
        "eval_loss",
        "eval_model_preparation_time",
        "eval_accuracy",
        "eval_runtime",
        "eval_samples_per_second",
        "eval_steps_per_second",
        "epoch",
    ]
    # Measured once before training, then reported by every later evaluation (as the reference does).
    assert after["eval_model_preparation_time"] == before["eval_model_preparation_time"]
    assert before["eval_loss"] != after["eval_loss"]
    assert predicted.predictions.shape == (10, 2)
    assert_results_match(result)
    assert_log_history_matches(result, loss_rtol=1e-6)


def test_token_classification_pads_predictions_and_labels_with_minus_100(tmp_path):
    """Batches of different widths concatenate with -100 on dim 1, in predictions and labels."""
    eval_data = token_classification_data()
    result = run_parity(
        make_tiny_bert_token_classifier(),
        None,
        tmp_path,
        trainer_kwargs={"data_collator": pad_token_batch, "compute_metrics": token_accuracy},
        run=steps(lambda t: t.evaluate(eval_data), lambda t: t.predict(eval_data)),
        per_device_eval_batch_size=3,
    )
    _, predicted = result.ours.output
    # Batches of widths 7, 6 and 3 (lengths 3,5,7 | 4,2,6 | 3): the second and third are padded to 7.
    assert predicted.predictions.shape == (7, 7, 3) and predicted.label_ids.shape == (7, 7)
    assert (predicted.label_ids[3:6, 6] == -100).all() and (predicted.predictions[6, 3:] == -100).all()
    assert predicted.metrics["test_tokens"] == 30
    assert_results_match(result)


def test_regression_evaluated_every_epoch(tmp_path):
    """A plain nn.Module regressor: eval each epoch in log_history, then predict() float predictions."""
    eval_data = regression_data(10, seed=1)
    result = run_parity(
        make_regression_mlp(),
        regression_data(16),
        tmp_path,
        trainer_kwargs={"eval_dataset": eval_data, "compute_metrics": mse},
        run=steps(train, lambda t: t.predict(eval_data)),
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        num_train_epochs=3,
        eval_strategy="epoch",
        logging_strategy="epoch",
        **EVAL,
    )
    eval_entries = [entry for entry in result.ours.log_history if "eval_loss" in entry]
    assert [entry["epoch"] for entry in eval_entries] == [1.0, 2.0, 3.0]
    assert [list(entry)[:3] for entry in eval_entries] == [["eval_loss", "eval_mse", "eval_max_error"]] * 3
    assert_results_match(result)
    assert_log_history_matches(result, loss_rtol=1e-6)


def test_dict_of_eval_datasets(tmp_path):
    """Each named dataset is evaluated with prefix eval_<name>, during training and through evaluate()."""
    eval_datasets = {"small": regression_data(5, seed=1), "large": regression_data(10, seed=2)}
    result = run_parity(
        make_regression_mlp(),
        regression_data(16),
        tmp_path,
        trainer_kwargs={"eval_dataset": eval_datasets, "compute_metrics": mse},
        run=steps(train, evaluate, lambda t: t.evaluate(metric_key_prefix="dev")),
        per_device_train_batch_size=4,
        max_steps=4,
        eval_strategy="steps",
        eval_steps=2,
        logging_steps=2,
        **EVAL,
    )
    _, metrics, dev_metrics = result.ours.output
    assert [key for key in metrics if key.endswith("_loss")] == ["eval_small_loss", "eval_large_loss"]
    assert "dev_large_mse" in dev_metrics
    # One log entry per dataset: at steps 2 and 4 during training, then from evaluate() (the "dev" call too).
    for name in ("small", "large"):
        assert [entry["step"] for entry in result.ours.log_history if f"eval_{name}_loss" in entry] == [
            2,
            4,
            4,
        ]
    assert [entry["step"] for entry in result.ours.log_history if "dev_large_loss" in entry] == [4]
    assert_results_match(result)
    assert_log_history_matches(result, loss_rtol=1e-6)


def test_eval_steps_with_gradient_accumulation(tmp_path):
    """eval_steps counts optimizer steps (GA 4): evaluations at the same steps, with the same values."""
    result = run_parity(
        make_tiny_bert_classifier(),
        classification_data(24),
        tmp_path,
        trainer_kwargs={"eval_dataset": classification_data(10, seed=1), "compute_metrics": accuracy},
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        learning_rate=5e-3,
        num_train_epochs=2,
        eval_strategy="steps",
        eval_steps=2,
        logging_steps=1,
        **EVAL,
    )
    eval_entries = [entry for entry in result.ours.log_history if "eval_loss" in entry]
    assert [entry["step"] for entry in eval_entries] == [2, 4, 6]
    assert len({entry["eval_loss"] for entry in eval_entries}) == 3
    assert_log_history_matches(result, loss_rtol=1e-6)


class StreamingAccuracy:
    """A `batch_eval_metrics` metric: counts per batch, reports on `compute_result=True`; records its calls."""

    def __init__(self):
        self.correct = self.total = 0
        self.calls = []

    def __call__(self, eval_prediction, compute_result):
        predictions = eval_prediction.predictions.argmax(-1)
        self.calls.append((tuple(predictions.shape), type(predictions).__name__, compute_result))
        self.correct += int((predictions == eval_prediction.label_ids).sum())
        self.total += len(predictions)
        if not compute_result:
            return {}
        result = {"accuracy": self.correct / self.total, "seen": self.total}
        self.correct = self.total = 0
        return result


def test_batch_eval_metrics(tmp_path):
    """compute_metrics per batch (torch tensors), compute_result on the last; during training and after."""
    metrics_of = {}

    def per_side(side):
        metrics_of[side] = StreamingAccuracy()
        return {"compute_metrics": metrics_of[side]}

    eval_data = classification_data(10, seed=1)
    result = run_parity(
        make_tiny_bert_classifier(),
        classification_data(8),
        tmp_path,
        trainer_kwargs={"eval_dataset": eval_data},
        reference_trainer_kwargs=per_side("reference"),
        our_trainer_kwargs=per_side("ours"),
        run=steps(train, lambda t: t.predict(eval_data)),
        per_device_train_batch_size=4,
        max_steps=2,
        eval_strategy="steps",
        eval_steps=1,
        logging_steps=1,
        batch_eval_metrics=True,
        **EVAL,
    )
    assert metrics_of["ours"].calls == metrics_of["reference"].calls
    assert metrics_of["ours"].calls[:3] == [
        ((4,), "Tensor", False),
        ((4,), "Tensor", False),
        ((2,), "Tensor", True),
    ]
    assert result.ours.output[1].metrics["test_seen"] == 10
    assert_results_match(result)
    assert_log_history_matches(result, loss_rtol=1e-6)


def test_include_for_metrics_inputs_and_losses(tmp_path):
    """`include_for_metrics=["inputs", "loss"]`: compute_metrics also gets the padded inputs and per-sample losses."""

    def with_inputs_and_losses(eval_prediction):
        assert len(eval_prediction.elements) == 4
        inputs, losses = eval_prediction.inputs, eval_prediction.losses
        return {
            "input_width": inputs.shape[1],
            "padded_inputs": int((inputs == -100).sum()),
            "mean_loss": float(losses.mean()),
            "losses": int(losses.shape[0]),
        }

    eval_data = token_classification_data()
    result = run_parity(
        make_tiny_bert_token_classifier(),
        None,
        tmp_path,
        trainer_kwargs={"data_collator": pad_token_batch, "compute_metrics": with_inputs_and_losses},
        run=steps(lambda t: t.evaluate(eval_data), lambda t: t.predict(eval_data)),
        per_device_eval_batch_size=3,
        include_for_metrics=["inputs", "loss"],
    )
    metrics = result.ours.output[0]
    # The collator pads ids with 0 inside a batch; across batches the loop pads with -100 (widths 7, 6, 3).
    assert metrics["eval_input_width"] == 7 and metrics["eval_padded_inputs"] == 3 * 1 + 1 * 4
    assert metrics["eval_losses"] == 7
    assert_results_match(result)


# ---- Seq2Seq generation -----------------------------------------------------------------------------------


def exact_match(eval_prediction):
    """Rows whose generated tokens equal the (pad-id padded) labels, and the number of pad ids generated."""
    predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
    width = min(predictions.shape[1], labels.shape[1])
    return {
        "exact": float((predictions[:, :width] == labels[:, :width]).all(axis=1).mean()),
        "pads": int((predictions == 0).sum()),
        "width": int(predictions.shape[1]),
    }


def run_seq2seq(tmp_path, run, **args_kwargs):
    return run_parity(
        make_tiny_t5(),
        seq2seq_data(8, seed=3),
        tmp_path,
        reference_trainer_cls=transformers.Seq2SeqTrainer,
        our_trainer_cls=Seq2SeqTrainer,
        reference_args_cls=transformers.Seq2SeqTrainingArguments,
        our_args_cls=Seq2SeqTrainingArguments,
        trainer_kwargs={
            "data_collator": pad_seq2seq_batch,
            "eval_dataset": seq2seq_data(5),
            "compute_metrics": exact_match,
        },
        run=run,
        per_device_eval_batch_size=2,
        predict_with_generate=True,
        **args_kwargs,
    )


def test_seq2seq_predict_with_generate_and_beams(tmp_path):
    """Beam search predictions padded with the pad id to the generation config's width; loss still reported."""
    test_data = seq2seq_data(5)
    result = run_seq2seq(
        tmp_path,
        steps(
            lambda t: t.predict(test_data),
            lambda t: t.predict(test_data, num_beams=3, max_new_tokens=4),
            lambda t: t.predict(test_data, max_length=None, num_beams=None),
        ),
        generation_num_beams=2,
        generation_max_length=6,
    )
    beams_2, beams_3, defaults = result.ours.output
    # Width 20: the model's generation config (max_length filled with its default), not the call's max_length.
    assert beams_2.predictions.shape == (5, 20) and beams_2.label_ids.shape == (5, 20)
    assert (beams_2.predictions[:, 6:] == 0).all() and (beams_2.label_ids[:, 3:] == 0).all()
    assert list(beams_2.metrics)[:4] == [
        "test_loss",
        "test_model_preparation_time",
        "test_exact",
        "test_pads",
    ]
    assert not np.array_equal(beams_2.predictions, beams_3.predictions)
    # An explicit None counts as "not given": the arguments' values fill it again.
    assert np.array_equal(defaults.predictions, beams_2.predictions)
    assert_results_match(result)


def test_seq2seq_evaluate_with_gen_kwargs_and_during_training(tmp_path):
    """evaluate(**gen_kwargs) before training, evaluation with generation during training, evaluate() after."""
    result = run_seq2seq(
        tmp_path,
        steps(
            lambda t: t.evaluate(max_new_tokens=3, num_beams=2),
            lambda t: t.evaluate(metric_key_prefix="beam4", num_beams=4, max_length=5),
            train,
            evaluate,
        ),
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        max_steps=4,
        eval_strategy="steps",
        eval_steps=2,
        logging_steps=1,
        generation_max_length=7,
    )
    first, beam4, _, after = result.ours.output
    assert first["eval_width"] == 20 and "beam4_exact" in beam4 and after["eval_loss"] != first["eval_loss"]
    eval_entries = [entry for entry in result.ours.log_history if "eval_exact" in entry]
    # train() starts a new TrainerState: the evaluations before it are not in log_history.
    assert [entry["step"] for entry in eval_entries] == [2, 4, 4]
    assert_results_match(result)
    assert_log_history_matches(result, loss_rtol=1e-6)


def test_seq2seq_loss_is_a_plain_mean_of_batch_means(tmp_path):
    """The Seq2Seq gather keeps the short last batch's padding: not the plain Trainer's sample-weighted loss."""
    eval_data = seq2seq_data(5)
    seq2seq = run_seq2seq(tmp_path / "s2s", steps(lambda t: t.evaluate(eval_data)), generation_max_length=4)
    plain = run_parity(
        make_tiny_t5(),
        None,
        tmp_path / "plain",
        trainer_kwargs={"data_collator": pad_seq2seq_batch},
        run=steps(lambda t: t.evaluate(eval_data)),
        per_device_eval_batch_size=2,
    )
    assert_results_match(seq2seq)
    assert_results_match(plain)
    assert seq2seq.ours.output[0]["eval_loss"] != pytest.approx(plain.ours.output[0]["eval_loss"], abs=1e-6)


# ---- the comparisons can fail --------------------------------------------------------------------------------


def test_a_desynchronised_seed_is_caught(tmp_path):
    """Mutation check: another seed on our side shuffles other batches, and the eval comparison fails."""
    result = run_parity(
        make_regression_mlp(),
        regression_data(16),
        tmp_path,
        our_seed=1,
        trainer_kwargs={"eval_dataset": regression_data(10, seed=1), "compute_metrics": mse},
        run=steps(train, evaluate),
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        **EVAL,
    )
    with pytest.raises(AssertionError):
        assert_metrics_match(result.ours.output[1], result.reference.output[1])
    # And a single changed prediction is not within "exactly equal".
    predictions = np.zeros((2, 3), dtype=np.float32)
    changed = predictions.copy()
    changed[1, 2] = np.float32(1e-7)
    with pytest.raises(AssertionError):
        assert_arrays_equal(changed, predictions)


def test_eval_on_start_and_eval_delay(tmp_path):
    """An evaluation before the first update, and none before `eval_delay` steps, as the reference."""
    result = run_parity(
        make_regression_mlp(),
        regression_data(16),
        tmp_path,
        trainer_kwargs={"eval_dataset": regression_data(6, seed=1), "compute_metrics": mse},
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        num_train_epochs=2,
        eval_strategy="steps",
        eval_steps=2,
        eval_delay=4,
        eval_on_start=True,
        logging_steps=2,
        **EVAL,
    )
    eval_steps = [entry["step"] for entry in result.ours.log_history if "eval_loss" in entry]
    assert eval_steps == [0, 4, 6, 8]
    assert_log_history_matches(result, loss_rtol=1e-6)


@pytest.mark.parametrize("iterable", [False, True], ids=["map-style", "iterable"])
def test_random_collator_and_random_eval_forward_draw_in_the_references_order(tmp_path, iterable):
    """A collator and an evaluation forward that both draw from the global RNG: the loader is read no further
    ahead than accelerate's prepared one (one batch), so each batch's noise and each forward's match."""
    from tests.distributed.iterable_script import (
        Examples,
        NoisyCollator,
        RecordingMLP,
        example_metrics,
        listed_examples,
    )

    make = Examples if iterable else listed_examples
    result = run_parity(
        RecordingMLP(),
        listed_examples(),
        tmp_path,
        trainer_kwargs={"eval_dataset": make(), "compute_metrics": example_metrics, "data_collator": NoisyCollator()},
        run=steps(evaluate, lambda t: t.predict(make())),
        per_device_eval_batch_size=2,
        seed=7,
    )
    assert_results_match(result)
