"""`EvaluationMixin` (evaluate / predict / evaluation_loop / prediction_step / _evaluate) against the reference.

Each test runs the same scenario through `transformers.Trainer(use_cpu=True)` and through a minimal facade
that inherits the mixin (`StandInTrainer`, below: it provides only the attributes the mixin relies on, written
as the reference writes them), on deep copies of one tiny model, and compares metrics (keys in order, values),
predictions, labels and the calls `compute_metrics` / callbacks received (EVAL-2.1 to EVAL-2.17).
"""

from __future__ import annotations

import contextlib
import copy
import math
import re

import numpy as np
import pytest
import torch
import transformers
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from hf_lightning.callbacks import CallbackHandler, DefaultFlowCallback, TrainerControl, TrainerState
from hf_lightning.callbacks import TrainerCallback as OurTrainerCallback
from hf_lightning.core.outputs import EvalLoopOutput, PredictionOutput
from hf_lightning.data.model_inputs import can_return_loss, infer_label_names, model_accepts_loss_kwargs
from hf_lightning.engine.loss import count_items_in_window, extract_loss
from hf_lightning.engine.memory import TrainerMemoryTracker
from hf_lightning.trainer.evaluation_methods import EvaluationMixin
from hf_lightning.translation.translate import translate
from tests.models import make_tiny_bert_classifier, make_tiny_t5

# ---------------------------------------------------------------------------------------------------------
# the stand-in facade
# ---------------------------------------------------------------------------------------------------------


class StandInTrainer(EvaluationMixin):
    """The facade attributes the mixin uses, nothing else (the reference's definitions, single process, CPU)."""

    def __init__(
        self,
        model,
        args,
        data_collator,
        eval_dataset=None,
        compute_metrics=None,
        preprocess_logits_for_metrics=None,
        callbacks=(),
    ):
        self.args = args
        self.plan = translate(args)
        self.model = model
        self.model_wrapped = model
        self.data_collator = data_collator
        self.eval_dataset = eval_dataset
        self.compute_metrics = compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.label_names = infer_label_names(model) if args.label_names is None else args.label_names
        self.can_return_loss = can_return_loss(model)
        self.model_accepts_loss_kwargs = model_accepts_loss_kwargs(model)
        self.optimizer, self.lr_scheduler = None, None
        self.deepspeed = None  # no DeepSpeed engine (the reference's attribute; None until train() builds one)
        self.is_in_train = False
        self._telemetry = None  # the facade's when the telemetry is switched off
        self.state = TrainerState()
        self.control = TrainerControl()
        self.callback_handler = CallbackHandler([DefaultFlowCallback, *callbacks], model, None, None, None)
        self._memory_tracker = TrainerMemoryTracker(args.skip_memory_metrics)
        self._telemetry = None  # the telemetry is off (core/blocked_time.py reads it)
        self._training_run = None  # no train() running (the facade's outside train())
        if getattr(model, "config", None) is not None:
            model.config.use_cache = args.use_cache

    def _report_to_hp_search(self, trial, step, metrics):
        assert trial is None  # no hyperparameter search in these tests

    def get_tp_size(self):
        return 1  # one process, no tensor parallelism

    def _dataloader(self, dataset):
        return DataLoader(
            dataset,
            batch_size=self.args.eval_batch_size,
            collate_fn=self.data_collator,
            drop_last=self.args.dataloader_drop_last,
        )

    def add_callback(self, callback):
        self.callback_handler.add_callback(callback)

    def get_eval_dataloader(self, eval_dataset=None):
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]
        return self._dataloader(eval_dataset if eval_dataset is not None else self.eval_dataset)

    def get_test_dataloader(self, test_dataset):
        return self._dataloader(test_dataset)

    def num_examples(self, dataloader):
        try:
            return len(dataloader.dataset)
        except (AttributeError, TypeError):
            return len(dataloader) * self.args.per_device_train_batch_size

    def _prepare_input(self, data):
        if isinstance(data, dict):
            return type(data)({k: self._prepare_input(v) for k, v in data.items()})
        if isinstance(data, (tuple, list)):
            return type(data)(self._prepare_input(v) for v in data)
        return data.to(self.args.device) if isinstance(data, torch.Tensor) else data

    def _prepare_inputs(self, inputs):
        return self._prepare_input(inputs)

    def _get_num_items_in_batch(self, batch_samples, device):
        if batch_samples and "labels" in batch_samples[0] and self.model_accepts_loss_kwargs:
            return count_items_in_window(batch_samples, shifts_labels=False)
        return None

    def compute_loss_context_manager(self):
        return contextlib.ExitStack()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.model_accepts_loss_kwargs and num_items_in_batch is not None:
            inputs = {**inputs, "num_items_in_batch": num_items_in_batch}
        outputs = model(**inputs)
        loss = extract_loss(outputs, inputs)
        return (loss, outputs) if return_outputs else loss

    def _current_loggers(self):
        return []  # no Lightning logger here: predict() publishes its metrics to none

    def log(self, logs, start_time=None):
        if self.state.epoch is not None:
            logs["epoch"] = self.state.epoch
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.callback_handler.on_log(self.args, self.state, self.control, logs)


# ---------------------------------------------------------------------------------------------------------
# tiny models and data
# ---------------------------------------------------------------------------------------------------------


class Plain(nn.Module):
    """Sequence classifier (`Plain`): mean-pooled embedding + linear; no **kwargs."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.head(self.embed(input_ids).mean(1))
        if labels is None:
            return {"logits": logits}
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class Tagger(nn.Module):
    """Token classifier whose outputs are as wide as each batch: logits (B, L, 3) and hidden (B, L, 8)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, input_ids, attention_mask=None, labels=None):
        hidden = self.embed(input_ids)
        logits = self.head(hidden)
        outputs = {"logits": logits, "hidden": hidden}
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.reshape(-1, 3), labels.reshape(-1), ignore_index=-100)
            outputs = {"loss": loss, **outputs}
        return outputs


class NanOnFirstBatch(Plain):
    """Loss is NaN for a batch whose first token is 1 (only the first batch of `nan_data`)."""

    def forward(self, input_ids, attention_mask=None, labels=None):
        outputs = super().forward(input_ids, attention_mask, labels)
        if labels is not None and int(input_ids[0, 0]) == 1:
            outputs["loss"] = outputs["loss"] * float("nan")
        return outputs


class Targets(nn.Module):
    """Labels under a name the reference does not infer (`targets`): needs `label_names=["targets"]`."""

    def __init__(self):
        super().__init__()
        self.inner = Plain()

    def forward(self, input_ids, attention_mask=None, targets=None):
        return self.inner(input_ids, labels=targets)


class ReturnsLoss(nn.Module):
    """No label argument, `return_loss=True` (CLIP-like): the loss is computed without labels."""

    def __init__(self):
        super().__init__()
        self.inner = Plain()

    def forward(self, input_ids, return_loss=True):
        logits = self.inner(input_ids)["logits"]
        return {"loss": logits.pow(2).mean(), "logits": logits}


class _Config:
    keys_to_ignore_at_inference = ["hidden"]


class TaggerWithConfig(Tagger):
    """A model with a `config` that names outputs to ignore at inference."""

    def __init__(self):
        super().__init__()
        self.config = _Config()


def toy_data(n=5, seed=0, with_labels=True, label_key="labels"):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 50, (n, 8), generator=generator)
    labels = torch.randint(0, 2, (n,), generator=generator)
    items = []
    for i in range(n):
        item = {"input_ids": ids[i], "attention_mask": torch.ones(8, dtype=torch.long)}
        if with_labels:
            item[label_key] = labels[i]
        items.append(item)
    return items


def var_data(lengths=(3, 5, 7, 4, 2), seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [
        {
            "input_ids": torch.randint(1, 50, (n,), generator=generator),
            "labels": torch.randint(0, 3, (n,), generator=generator),
        }
        for n in lengths
    ]


def nan_data():
    items = toy_data(5)
    items[0]["input_ids"] = items[0]["input_ids"].clone()
    items[0]["input_ids"][0] = 1
    return items


def stack_collate(features):
    return {key: torch.stack([torch.as_tensor(f[key]) for f in features]) for key in features[0]}


def pad_collate(features):
    width = max(len(f["input_ids"]) for f in features)
    batch = {"input_ids": torch.zeros(len(features), width, dtype=torch.long)}
    if "labels" in features[0]:
        batch["labels"] = torch.full((len(features), width), -100, dtype=torch.long)
    for row, feature in enumerate(features):
        n = len(feature["input_ids"])
        batch["input_ids"][row, :n] = feature["input_ids"]
        if "labels" in batch:
            batch["labels"][row, :n] = feature["labels"]
    return batch


class Stream(IterableDataset):
    """An unsized dataset: the loop counts samples, the last batch is known only when the stream ends."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)


def build(model_class):
    torch.manual_seed(0)
    return model_class()


# ---------------------------------------------------------------------------------------------------------
# running both sides and comparing
# ---------------------------------------------------------------------------------------------------------

BASE_ARGS = {"use_cpu": True, "report_to": "none", "disable_tqdm": True, "per_device_eval_batch_size": 2}
TIMING_SUFFIXES = ("_runtime", "_samples_per_second", "_steps_per_second", "_model_preparation_time")


FACADES = ["stand-in", "hf_lightning"]


@pytest.fixture(params=FACADES)
def facade(request):
    """Which trainer inherits the mixin on our side: the test stand-in, or the real `HFLightningTrainer`."""
    return request.param


def make_pair(facade, tmp_path, model, collate=stack_collate, args=None, per_side=None, **shared):
    """(reference, ours) on deep copies of `model`; `per_side()` gives fresh kwargs (recorders) to each side.

    The stand-in shares the reference's `TrainingArguments` (building a second one resets accelerate's global
    state under the reference's accelerator; the mixin only reads them); the real facade gets ours.
    """
    merged = {**BASE_ARGS, **(args or {})}
    reference_args = transformers.TrainingArguments(output_dir=str(tmp_path / "ref"), **merged)
    ref = transformers.Trainer(
        model=copy.deepcopy(model),
        args=reference_args,
        data_collator=collate,
        **shared,
        **(per_side("ref") if per_side else {}),
    )
    if facade == "stand-in":
        trainer_class, our_args = StandInTrainer, reference_args
    else:
        from hf_lightning import HFLightningTrainer, TrainingArguments

        trainer_class, our_args = (
            HFLightningTrainer,
            TrainingArguments(output_dir=str(tmp_path / "ours"), **merged),
        )
    ours = trainer_class(
        model=copy.deepcopy(model),
        args=our_args,
        data_collator=collate,
        **shared,
        **(per_side("ours") if per_side else {}),
    )
    return ref, ours


def assert_metrics_match(ours, ref):
    """Same keys in the same order; losses to 1e-6; timing keys present and non-negative; the rest equal."""
    assert list(ours) == list(ref), (list(ref), list(ours))
    for key, ref_value in ref.items():
        value = ours[key]
        if key.endswith(TIMING_SUFFIXES):
            assert isinstance(value, float) and value >= 0, (key, value)
        elif isinstance(ref_value, float) and math.isnan(ref_value):
            assert math.isnan(value), (key, value)
        elif key.endswith("_loss"):
            assert value == pytest.approx(ref_value, abs=1e-6), (key, ref_value, value)
        else:
            assert value == ref_value and type(value) is type(ref_value), (key, ref_value, value)


def assert_arrays_match(ours, ref):
    """Same nesting, dtypes and shapes; values to 1e-6 (the -100 padding included)."""
    assert type(ours) is type(ref), (type(ref), type(ours))
    if isinstance(ref, (list, tuple)):
        assert len(ours) == len(ref)
        for o, r in zip(ours, ref):
            assert_arrays_match(o, r)
    elif isinstance(ref, np.ndarray):
        assert ours.dtype == ref.dtype and ours.shape == ref.shape, (
            ref.dtype,
            ref.shape,
            ours.dtype,
            ours.shape,
        )
        np.testing.assert_allclose(ours, ref, atol=1e-6, rtol=0)
    else:
        assert ours == ref


def assert_predictions_match(ours, ref):
    assert isinstance(ours, PredictionOutput)
    assert_arrays_match(ours.predictions, ref.predictions)
    assert_arrays_match(ours.label_ids, ref.label_ids)
    assert_metrics_match(ours.metrics, ref.metrics)


def _shape(value):
    if isinstance(value, (list, tuple)):
        return type(value).__name__, [_shape(v) for v in value]
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if value is None:
        return None
    return type(value).__name__, tuple(value.shape), str(value.dtype).replace("torch.", "")


class MetricsRecorder:
    """`compute_metrics` that records what it receives and returns values of several types."""

    def __init__(self):
        self.calls = []

    def __call__(self, eval_prediction, compute_result=None):
        self.calls.append(
            {
                "elements": len(eval_prediction.elements),
                "predictions": _shape(eval_prediction.predictions),
                "label_ids": _shape(eval_prediction.label_ids),
                "inputs": _shape(eval_prediction.inputs),
                "losses": _shape(eval_prediction.losses),
                "compute_result": compute_result,
            }
        )
        return {"acc": np.float32(0.25), "eval_custom": torch.tensor(1.5), "t": 3, "n": len(self.calls)}


def recorders(side):
    return {"compute_metrics": MetricsRecorder()}


def event_recorder(base):
    class EventRecorder(base):
        def __init__(self):
            self.events = []

        def on_prediction_step(self, args, state, control, **kwargs):
            self.events.append(("on_prediction_step", kwargs["eval_dataloader"] is not None))

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            self.events.append(("on_evaluate", list(metrics)))

        def on_predict(self, args, state, control, metrics=None, **kwargs):
            self.events.append(("on_predict", list(metrics)))

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.events.append(("on_log", list(logs)))

    return EventRecorder()


# ---------------------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------------------


def test_evaluate_before_training_tiny_bert(facade, tmp_path):
    """EVAL-2.1 / EVAL-2.9 / EVAL-2.12: keys, sample-weighted loss, preparation time kept, one log entry with `step`."""
    data = toy_data(5)
    ref, ours = make_pair(facade, tmp_path, make_tiny_bert_classifier(), eval_dataset=data)
    ref_metrics, our_metrics = ref.evaluate(), ours.evaluate()
    assert list(our_metrics) == [
        "eval_loss",
        "eval_model_preparation_time",
        "eval_runtime",
        "eval_samples_per_second",
        "eval_steps_per_second",
        "epoch",
    ]
    assert_metrics_match(our_metrics, ref_metrics)
    assert [list(entry) for entry in ours.state.log_history] == [
        list(entry) for entry in ref.state.log_history
    ]
    assert ours.state.log_history[-1]["step"] == 0 and len(ours.state.log_history) == 1
    assert ours.model_preparation_time == our_metrics["eval_model_preparation_time"]
    # Measured once, then reported unchanged by every later evaluate / predict.
    again = ours.evaluate()
    assert again["eval_model_preparation_time"] == ours.model_preparation_time
    assert_metrics_match(again, ref.evaluate())
    assert "test_model_preparation_time" in ours.predict(data).metrics


def test_eval_loss_is_sample_weighted_and_drop_last_keeps_num_samples(facade, tmp_path):
    """EVAL-2.9 / EVAL-2.10: the short last batch counts once per sample; with drop_last it is never seen."""
    data = toy_data(5)
    ref, ours = make_pair(facade, tmp_path, build(Plain), eval_dataset=data)
    our_metrics = ours.evaluate()
    assert_metrics_match(our_metrics, ref.evaluate())
    model = ours.model
    with torch.no_grad():
        batch_losses = [model(**stack_collate(data[i : i + 2]))["loss"].item() for i in (0, 2, 4)]
    assert our_metrics["eval_loss"] == pytest.approx(
        (2 * batch_losses[0] + 2 * batch_losses[1] + batch_losses[2]) / 5
    )
    assert our_metrics["eval_loss"] != pytest.approx(sum(batch_losses) / 3, abs=1e-7)

    ref, ours = make_pair(
        facade, tmp_path, build(Plain), args={"dataloader_drop_last": True}, eval_dataset=data
    )
    assert_predictions_match(ours.predict(data), ref.predict(data))


def test_predict_pads_variable_length_outputs_with_minus_100(facade, tmp_path):
    """EVAL-2.2 / EVAL-2.4: a tuple of predictions (5,7,3) and (5,7,8), labels (5,7), padded right with -100."""
    data = var_data()
    ref, ours = make_pair(facade, tmp_path, build(Tagger), collate=pad_collate)
    ref_output, our_output = ref.predict(data), ours.predict(data)
    assert_predictions_match(our_output, ref_output)
    logits, hidden = our_output.predictions
    assert logits.shape == (5, 7, 3) and hidden.shape == (5, 7, 8) and our_output.label_ids.shape == (5, 7)
    assert (our_output.label_ids[0, 3:] == -100).all() and (logits[0, 5:] == -100).all()
    assert list(our_output.metrics) == [
        "test_loss",
        "test_model_preparation_time",
        "test_runtime",
        "test_samples_per_second",
        "test_steps_per_second",
    ]


ACCUMULATION_ARGS = [
    {"eval_accumulation_steps": 1},
    {"eval_accumulation_steps": 2},
    {"eval_do_concat_batches": False},
    {"eval_do_concat_batches": False, "eval_accumulation_steps": 2},
]


def _variants(values, real_facade_values):
    """Every value with the stand-in; the real facade only on some (the loop is the same code; time budget)."""
    return [("stand-in", v) for v in values] + [("hf_lightning", v) for v in real_facade_values]


@pytest.mark.parametrize(
    ("facade", "args"), _variants(ACCUMULATION_ARGS, [ACCUMULATION_ARGS[1], ACCUMULATION_ARGS[3]])
)
def test_eval_accumulation_steps_and_unconcatenated_batches(facade, tmp_path, args):
    """EVAL-2.5: accumulation on numpy gives the same arrays; without concatenation, one array per batch."""
    data = var_data()
    ref, ours = make_pair(facade, tmp_path, build(Tagger), collate=pad_collate, args=args, per_side=recorders)
    ref_output, our_output = ref.predict(data), ours.predict(data)
    assert_predictions_match(our_output, ref_output)
    assert ours.compute_metrics.calls == ref.compute_metrics.calls
    if not args.get("eval_do_concat_batches", True):
        assert [p[0].shape for p in our_output.predictions] == [(2, 5, 3), (2, 7, 3), (1, 2, 3)]
    assert_metrics_match(ours.evaluate(data), ref.evaluate(data))


def test_include_for_metrics_inputs_and_losses(facade, tmp_path):
    """EVAL-2.6: `compute_metrics` gets inputs (5,7) and per-sample losses (5,), 4 elements."""
    data = var_data()
    args = {"include_for_metrics": ["inputs", "loss"]}
    ref, ours = make_pair(facade, tmp_path, build(Tagger), collate=pad_collate, args=args, per_side=recorders)
    assert_metrics_match(ours.evaluate(data), ref.evaluate(data))
    assert ours.compute_metrics.calls == ref.compute_metrics.calls
    call = ours.compute_metrics.calls[0]
    assert call["elements"] == 4 and call["inputs"][1] == (5, 7) and call["losses"][1] == (5,)


@pytest.mark.parametrize(("facade", "include"), _variants([[], ["inputs", "loss"]], [["inputs", "loss"]]))
def test_batch_eval_metrics_per_batch_calls(facade, tmp_path, include):
    """EVAL-2.7: one call per batch with tensors, compute_result only on the last; last call's metrics."""
    data = var_data()
    args = {"batch_eval_metrics": True, "include_for_metrics": include}
    ref, ours = make_pair(facade, tmp_path, build(Tagger), collate=pad_collate, args=args, per_side=recorders)
    our_metrics = ours.evaluate(data)
    assert_metrics_match(our_metrics, ref.evaluate(data))
    assert ours.compute_metrics.calls == ref.compute_metrics.calls
    assert [(c["predictions"][1][0][1], c["compute_result"]) for c in ours.compute_metrics.calls] == [
        ((2, 5, 3), False),
        ((2, 7, 3), False),
        ((1, 2, 3), True),
    ]
    assert our_metrics["eval_n"] == 3
    # predict still accumulates predictions in batch mode.
    assert_predictions_match(ours.predict(data), ref.predict(data))
    assert ours.compute_metrics.calls == ref.compute_metrics.calls


def test_preprocess_logits_for_metrics_replaces_predictions(facade, tmp_path):
    """EVAL-2.8: argmax preprocessing gives int predictions (5,7) padded with -100."""
    data = var_data()
    seen = {"ref": [], "ours": []}

    def per_side(side):
        def argmax(logits, labels):
            seen[side].append((tuple(logits[0].shape), None if labels is None else tuple(labels.shape)))
            return logits[0].argmax(-1)

        return {"preprocess_logits_for_metrics": argmax, "compute_metrics": MetricsRecorder()}

    ref, ours = make_pair(facade, tmp_path, build(Tagger), collate=pad_collate, per_side=per_side)
    our_output = ours.predict(data)
    assert_predictions_match(our_output, ref.predict(data))
    assert our_output.predictions.shape == (5, 7) and our_output.predictions.dtype == np.int64
    assert (our_output.predictions[0, 5:] == -100).all() and (our_output.predictions[0, :5] != -100).all()
    assert seen["ours"] == seen["ref"]
    assert ours.compute_metrics.calls == ref.compute_metrics.calls


@pytest.mark.parametrize(("facade", "nan_filter"), _variants([True, False], [True]))
def test_nan_eval_loss_filter(facade, tmp_path, nan_filter):
    """EVAL-2.9: non-finite batch losses are dropped when at least one is finite, unless the filter is off."""
    data = nan_data()
    args = {"logging_nan_inf_filter": nan_filter}
    ref, ours = make_pair(facade, tmp_path, build(NanOnFirstBatch), args=args, eval_dataset=data)
    our_metrics = ours.evaluate()
    assert_metrics_match(our_metrics, ref.evaluate())
    assert math.isnan(our_metrics["eval_loss"]) is (not nan_filter)


def test_metric_key_prefixing_and_order(facade, tmp_path):
    """EVAL-2.11: unprefixed keys are renamed and moved to the end; prefix `test` and custom prefixes."""
    data = toy_data(5)
    ref, ours = make_pair(facade, tmp_path, build(Plain), per_side=recorders, eval_dataset=data)
    our_metrics = ours.evaluate()
    assert_metrics_match(our_metrics, ref.evaluate())
    assert list(our_metrics)[:5] == [
        "eval_custom",
        "eval_loss",
        "eval_model_preparation_time",
        "eval_acc",
        "eval_t",
    ]
    assert isinstance(our_metrics["eval_acc"], float) and isinstance(our_metrics["eval_custom"], float)
    assert_predictions_match(ours.predict(data), ref.predict(data))
    assert_predictions_match(
        ours.predict(data, metric_key_prefix="dev"), ref.predict(data, metric_key_prefix="dev")
    )
    assert_metrics_match(ours.evaluate(metric_key_prefix="dev"), ref.evaluate(metric_key_prefix="dev"))


@pytest.mark.parametrize(("facade", "passed"), _variants([False, True], [False]))
def test_dict_eval_datasets(facade, tmp_path, passed):
    """EVAL-2.1 (a) / EVAL-2.11: one evaluation per entry, `eval_a_*` then `eval_b_*`, one `epoch` key."""
    datasets = {"a": toy_data(5, seed=1), "b": toy_data(4, seed=2)}
    stored = None if passed else datasets
    ref, ours = make_pair(facade, tmp_path, build(Plain), per_side=recorders, eval_dataset=stored)
    our_metrics = ours.evaluate(datasets if passed else None)
    assert_metrics_match(our_metrics, ref.evaluate(datasets if passed else None))
    assert [k for k in our_metrics if k.endswith("_loss")] == ["eval_a_loss", "eval_b_loss"]
    assert len(ours.state.log_history) == 2


def test_predict_without_labels_and_prediction_loss_only(facade, tmp_path):
    """EVAL-2.15: no log entry; without labels only logits and timing keys; loss-only gives no arrays."""
    unlabeled = toy_data(5, with_labels=False)
    ref, ours = make_pair(facade, tmp_path, build(Plain), per_side=recorders)
    our_output = ours.predict(unlabeled)
    assert_predictions_match(our_output, ref.predict(unlabeled))
    assert our_output.label_ids is None and our_output.predictions.shape == (5, 2)
    assert ours.state.log_history == [] and ours.compute_metrics.calls == []
    assert "test_loss" not in our_output.metrics

    labeled = toy_data(5)
    ref, ours = make_pair(
        facade, tmp_path, build(Plain), args={"prediction_loss_only": True}, per_side=recorders
    )
    our_output = ours.predict(labeled)
    assert_predictions_match(our_output, ref.predict(labeled))
    assert our_output.predictions is None and our_output.label_ids is None
    assert ours.compute_metrics.calls == []


def test_custom_label_names_and_loss_without_labels(facade, tmp_path):
    """EVAL-2.3: `label_names=["targets"]` finds the labels; a `return_loss=True` model has a loss without them."""
    data = toy_data(5, label_key="targets")
    ref, ours = make_pair(
        facade, tmp_path, build(Targets), args={"label_names": ["targets"]}, per_side=recorders
    )
    assert_predictions_match(ours.predict(data), ref.predict(data))
    assert ours.compute_metrics.calls == ref.compute_metrics.calls and len(ours.compute_metrics.calls) == 1

    unlabeled = toy_data(5, with_labels=False)
    ref, ours = make_pair(facade, tmp_path, build(ReturnsLoss), per_side=recorders)
    assert ours.label_names == [] and ours.can_return_loss
    our_output = ours.predict([{"input_ids": item["input_ids"]} for item in unlabeled])
    assert_predictions_match(
        our_output, ref.predict([{"input_ids": item["input_ids"]} for item in unlabeled])
    )
    assert "test_loss" in our_output.metrics
    assert ours.compute_metrics.calls == ref.compute_metrics.calls


def test_ignore_keys_from_argument_and_from_config(facade, tmp_path):
    """EVAL-2.3: `ignore_keys` drops outputs; the default comes from `config.keys_to_ignore_at_inference`."""
    data = var_data()
    ref, ours = make_pair(facade, tmp_path, build(Tagger), collate=pad_collate)
    our_output = ours.predict(data, ignore_keys=["hidden"])
    assert_predictions_match(our_output, ref.predict(data, ignore_keys=["hidden"]))
    assert isinstance(our_output.predictions, np.ndarray)

    ref, ours = make_pair(facade, tmp_path, build(TaggerWithConfig), collate=pad_collate)
    our_output = ours.predict(data)
    assert_predictions_match(our_output, ref.predict(data))
    assert our_output.predictions.shape == (5, 7, 3)


def test_predict_encoder_decoder_outputs(facade, tmp_path):
    """EVAL-2.3: TinyT5 without generation predicts (logits, encoder last hidden state): (6,3,40), (6,5,16)."""
    generator = torch.Generator().manual_seed(0)
    data = [
        {
            "input_ids": torch.randint(2, 40, (5,), generator=generator),
            "attention_mask": torch.ones(5, dtype=torch.long),
            "labels": torch.randint(2, 40, (3,), generator=generator),
        }
        for _ in range(6)
    ]
    ref, ours = make_pair(facade, tmp_path, make_tiny_t5())
    our_output = ours.predict(data)
    assert_predictions_match(our_output, ref.predict(data))
    assert [p.shape for p in our_output.predictions] == [(6, 3, 40), (6, 5, 16)]


def test_unsized_dataset(facade, tmp_path):
    """EVAL-2.10: samples are counted; the last batch is still known (compute_result) and weighted."""
    data = toy_data(5)
    args = {"batch_eval_metrics": True}
    ref, ours = make_pair(facade, tmp_path, build(Plain), args=args, per_side=recorders)
    our_metrics = ours.evaluate(Stream(data))
    assert_metrics_match(our_metrics, ref.evaluate(Stream(data)))
    assert ours.compute_metrics.calls == ref.compute_metrics.calls
    assert [c["compute_result"] for c in ours.compute_metrics.calls] == [False, False, True]
    assert_predictions_match(ours.predict(Stream(data)), ref.predict(Stream(data)))


def test_callback_events(facade, tmp_path):
    """EVAL-2.1 / EVAL-2.2 / EVAL-2.15: on_prediction_step per batch, then on_log + on_evaluate, or on_predict."""
    data = toy_data(5)
    ref, ours = make_pair(facade, tmp_path, build(Plain), eval_dataset=data)
    ref_recorder, our_recorder = (
        event_recorder(transformers.TrainerCallback),
        event_recorder(OurTrainerCallback),
    )
    ref.add_callback(ref_recorder)
    ours.add_callback(our_recorder)
    for trainer in (ref, ours):
        trainer.evaluate()
        trainer.predict(data)
    assert our_recorder.events == ref_recorder.events
    assert [event for event, _ in our_recorder.events].count("on_prediction_step") == 6
    assert ours.callback_handler.eval_dataloader is not None


@pytest.mark.parametrize(
    ("args", "model_dtype", "predictions_dtype"),
    [
        ({"bf16_full_eval": True}, torch.bfloat16, np.float32),
        ({"fp16_full_eval": True}, torch.float16, np.float16),
        ({"bf16": True}, torch.float32, np.float32),
    ],
)
def test_low_precision_evaluation(facade, tmp_path, args, model_dtype, predictions_dtype):
    """Full fp16/bf16 eval casts the model outside training; `bf16` autocasts the forward, float32 outputs."""
    data = var_data()
    ref, ours = make_pair(facade, tmp_path, build(Tagger), collate=pad_collate, args=args)
    our_output = ours.predict(data)
    assert_predictions_match(our_output, ref.predict(data))
    assert our_output.predictions[0].dtype == predictions_dtype
    assert next(ours.model.parameters()).dtype == model_dtype


def test_no_cast_while_training(facade, tmp_path):
    data = toy_data(5)
    ref, ours = make_pair(facade, tmp_path, build(Plain), args={"bf16_full_eval": True}, eval_dataset=data)
    # As inside train(): the engine holds the prepared model (so no preparation time either).
    ref.accelerator._models.append(ref.model)
    ours._model_is_prepared = True
    ref.is_in_train = ours.is_in_train = True
    assert_metrics_match(ours.evaluate(), ref.evaluate())
    assert next(ours.model.parameters()).dtype == torch.float32


def test_no_preparation_time_after_training(facade, tmp_path):
    """EVAL-2.12: after `train()` (which prepares the model) evaluate reports no preparation time."""
    data = toy_data(6)
    args = {"max_steps": 1, "save_strategy": "no", "per_device_train_batch_size": 2}
    ref, ours = make_pair(facade, tmp_path, build(Plain), args=args, eval_dataset=data)
    for trainer in (ref, ours):
        trainer.train_dataset = data
        if trainer is ref or facade == "hf_lightning":
            trainer.train()
        else:
            ours._model_is_prepared = True  # what the facade's train() does
    ours.state.epoch = ref.state.epoch
    ours.model.load_state_dict(ref.model.state_dict())
    ref_metrics, our_metrics = ref.evaluate(), ours.evaluate()
    assert "eval_model_preparation_time" not in ref_metrics
    assert_metrics_match(our_metrics, ref_metrics)
    assert not hasattr(ours, "model_preparation_time")


def test_plain_gather_counts_the_last_batch_as_full(facade, tmp_path):
    """EVAL-2.10: Seq2SeqTrainer's gather keeps the last batch's padding (a plain mean of batch means)."""
    data = toy_data(5)
    _, ours = make_pair(facade, tmp_path, build(Plain), eval_dataset=data)
    reference = transformers.Seq2SeqTrainer(
        model=build(Plain),
        args=transformers.Seq2SeqTrainingArguments(output_dir=str(tmp_path / "s2s"), **BASE_ARGS),
        data_collator=stack_collate,
        eval_dataset=data,
    )
    ours._gather_drops_padding = False
    assert_metrics_match(ours.evaluate(), reference.evaluate())
    assert ours._gather_drops_padding is True  # reset after the loop, like the reference's gather_function
    assert ours.evaluate()["eval_loss"] != pytest.approx(reference.evaluate()["eval_loss"], abs=1e-7)


def _plateau(trainer):
    trainer.optimizer = torch.optim.SGD(trainer.model.parameters(), lr=0.1)
    trainer.lr_scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(trainer.optimizer, patience=0)


def test_evaluate_steps_plateau_scheduler_with_the_metric(facade, tmp_path):
    """EVAL-2.16: `_evaluate` steps ReduceLROnPlateau with `eval_<metric_for_best_model>`, unless skipped."""
    data = toy_data(5)
    ref, ours = make_pair(
        facade, tmp_path, build(Plain), args={"metric_for_best_model": "loss"}, eval_dataset=data
    )
    for trainer in (ref, ours):
        _plateau(trainer)
        trainer._evaluate(None, None)
        trainer._evaluate(None, None, skip_scheduler=True)
        trainer._evaluate(None, None)
    for attribute in ("best", "num_bad_epochs", "last_epoch"):
        assert getattr(ours.lr_scheduler, attribute) == pytest.approx(getattr(ref.lr_scheduler, attribute))
    assert ours.lr_scheduler.last_epoch == 2
    assert ours.optimizer.param_groups[0]["lr"] == pytest.approx(ref.optimizer.param_groups[0]["lr"])


def test_evaluate_missing_metric_raises_the_reference_key_error(facade, tmp_path):
    data = toy_data(5)
    ref, ours = make_pair(
        facade, tmp_path, build(Plain), args={"metric_for_best_model": "accuracy"}, eval_dataset=data
    )
    messages = []
    for trainer in (ref, ours):
        _plateau(trainer)
        with pytest.raises(KeyError) as error:
            trainer._evaluate(None, None)
        messages.append(re.sub(r"'eval_(runtime|samples_per_second|steps_per_second)'", "", str(error.value)))
    assert messages[0] == messages[1]
    assert "eval_accuracy" in messages[1]


def test_evaluate_out_of_memory_message_with_auto_find_batch_size(facade, tmp_path):
    data = toy_data(5)
    _, ours = make_pair(
        facade, tmp_path, build(Plain), args={"auto_find_batch_size": True}, eval_dataset=data
    )

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")

    ours.evaluation_loop = out_of_memory
    with pytest.raises(RuntimeError, match="reduce `per_device_eval_batch_size`"):
        ours._evaluate(None, None)


class _ScheduleFreeLikeOptimizer:
    """Records the mode switches the loop makes (schedule-free optimizers have train() / eval())."""

    def __init__(self):
        self.calls = []

    def eval(self):
        self.calls.append("eval")

    def train(self):
        self.calls.append("train")


def test_evaluation_loop_output_and_eval_modes(facade, tmp_path):
    """EVAL-2.2: the model and an optimizer with `eval()` are put in eval mode; an `EvalLoopOutput` comes back."""
    data = toy_data(5)
    ref, ours = make_pair(facade, tmp_path, build(Plain), eval_dataset=data)
    outputs = []
    for trainer in (ref, ours):
        trainer.model.train()
        trainer.optimizer = _ScheduleFreeLikeOptimizer()
        outputs.append(
            trainer.evaluation_loop(trainer.get_eval_dataloader(), "Evaluation", prediction_loss_only=False)
        )
        assert not trainer.model.training
    assert ours.optimizer.calls == ref.optimizer.calls == ["eval"]
    assert isinstance(outputs[1], EvalLoopOutput) and outputs[1].num_samples == outputs[0].num_samples == 5
    assert_arrays_match(outputs[1].predictions, outputs[0].predictions)
    assert_arrays_match(outputs[1].label_ids, outputs[0].label_ids)
    assert_metrics_match(outputs[1].metrics, outputs[0].metrics)


_WITHOUT_TRANSFORMERS = """
import sys


class BlockOptional:  # makes transformers and accelerate unimportable
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("transformers", "accelerate"):
            raise ImportError(f"{name} is blocked in this test")
        return None


sys.meta_path.insert(0, BlockOptional())
import contextlib
from types import SimpleNamespace

import torch
from torch import nn

from hf_lightning.callbacks import CallbackHandler, DefaultFlowCallback, TrainerControl, TrainerState
from hf_lightning.engine.memory import TrainerMemoryTracker
from hf_lightning.trainer.evaluation_methods import EvaluationMixin
from hf_lightning.translation.translate import translate


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(50, 8), nn.Linear(8, 2)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.embed(input_ids).mean(1))
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class Facade(EvaluationMixin):
    def __init__(self, model, args):
        self.model = self.model_wrapped = model
        self.args, self.state, self.control = args, TrainerState(), TrainerControl()
        self.plan = translate(args)
        self.callback_handler = CallbackHandler([DefaultFlowCallback], model, None, None, None)
        self.label_names, self.can_return_loss = ["labels"], False
        self.compute_metrics = self.preprocess_logits_for_metrics = self.optimizer = self.lr_scheduler = self.deepspeed = None
        self.is_in_train = False
        self._telemetry = None  # the facade's when the telemetry is switched off
        self._memory_tracker = TrainerMemoryTracker(skip_memory_metrics=True)
        self._training_run = None  # no train() running

    def get_test_dataloader(self, dataset):
        return torch.utils.data.DataLoader(dataset, batch_size=self.args.eval_batch_size)

    def _current_loggers(self):
        return []

    def get_tp_size(self):
        return 1

    def num_examples(self, dataloader):
        return len(dataloader.dataset)

    def _prepare_input(self, data):
        return data

    _prepare_inputs = _prepare_input

    def _get_num_items_in_batch(self, batch_samples, device):
        return None

    def compute_loss_context_manager(self):
        return contextlib.ExitStack()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        return (outputs["loss"], outputs) if return_outputs else outputs["loss"]


args = SimpleNamespace(
    eval_batch_size=2, world_size=1, prediction_loss_only=False, fp16_full_eval=False, bf16_full_eval=False,
    device=torch.device("cpu"), eval_do_concat_batches=True, include_for_metrics=[], batch_eval_metrics=False,
    eval_accumulation_steps=None, logging_nan_inf_filter=True, bf16=False, fp16=False,
)
data = [{"input_ids": torch.arange(i, i + 8), "labels": i % 2} for i in range(5)]
output = Facade(Plain(), args).predict(data)
assert output.predictions.shape == (5, 2) and "test_loss" in output.metrics, output
assert not any(name.split(".")[0] in ("transformers", "accelerate") for name in sys.modules)
print("ok")
"""


def test_evaluation_runs_without_transformers(tmp_path):
    """transformers and accelerate stay optional: the mixin predicts with a plain module without them."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TRANSFORMERS, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
