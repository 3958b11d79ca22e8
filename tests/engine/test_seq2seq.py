"""`HFLightningSeq2SeqTrainer` (S2S-6.1 to S2S-6.3): constructor, generation config loading, the `generate()`
keywords of each call, padding, errors, the registry notes, and the path without transformers.

Where a rule names an observable, it is compared with `transformers.Seq2SeqTrainer`.
"""

from __future__ import annotations

import copy
import inspect
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
import transformers
from torch import nn

from hf_lightning import (
    HFLightningSeq2SeqTrainer,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainingArguments,
)
from hf_lightning.trainer.seq2seq import resolve_gen_kwargs
from hf_lightning.translation.translate import translate
from tests.models import make_tiny_t5, pad_seq2seq_batch, seq2seq_data
from tests.no_transformers import BLOCK_TRANSFORMERS
from tests.parity.harness import assert_arrays_equal, assert_metrics_match, assert_predictions_equal

BASE = {"use_cpu": True, "report_to": "none", "disable_tqdm": True, "per_device_eval_batch_size": 2}


class GenerateSpy:
    """Wraps `model.generate` and records the keywords of each call (the generation inputs left out)."""

    def __init__(self, generate):
        self.generate = generate
        self.calls = []

    def __call__(self, **kwargs):
        self.calls.append(
            {k: v for k, v in kwargs.items() if k not in ("input_ids", "attention_mask", "labels")}
        )
        return self.generate(**kwargs)


def pair(tmp_path, model=None, spy=False, **kwargs):
    """(reference, ours) Seq2Seq trainers on copies of TinyT5; `kwargs` go to the arguments except trainer ones."""
    trainer_keys = ("compute_metrics", "eval_dataset", "processing_class")
    trainer_kwargs = {k: kwargs.pop(k) for k in trainer_keys if k in kwargs}
    model = model if model is not None else make_tiny_t5()
    reference = transformers.Seq2SeqTrainer(
        model=copy.deepcopy(model),
        args=transformers.Seq2SeqTrainingArguments(output_dir=str(tmp_path / "ref"), **BASE, **kwargs),
        data_collator=pad_seq2seq_batch,
        **trainer_kwargs,
    )
    ours = Seq2SeqTrainer(
        model=copy.deepcopy(model),
        args=Seq2SeqTrainingArguments(output_dir=str(tmp_path / "ours"), **BASE, **kwargs),
        data_collator=pad_seq2seq_batch,
        **trainer_kwargs,
    )
    if spy:
        for trainer in (reference, ours):
            trainer.model.generate = GenerateSpy(trainer.model.generate)
    return reference, ours


def width(eval_prediction):
    return {"width": eval_prediction.predictions.shape[1]}


# ---- construction -------------------------------------------------------------------------------------------


def test_aliases_and_signature_match_the_reference():
    """API-1.1.1: the reference's parameters and defaults; no `optimizer_cls_and_kwargs`."""
    assert Seq2SeqTrainer is HFLightningSeq2SeqTrainer

    def parameters(cls):
        return [(p.name, p.default) for p in inspect.signature(cls.__init__).parameters.values()]

    assert parameters(Seq2SeqTrainer) == parameters(transformers.Seq2SeqTrainer)
    assert "optimizer_cls_and_kwargs" not in dict(parameters(Seq2SeqTrainer))


def test_unknown_keywords_raise_type_error_and_tokenizer_is_the_documented_alias(tmp_path):
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), **BASE)
    with pytest.raises(TypeError, match="unexpected keyword argument 'optimizer_cls_and_kwargs'"):
        Seq2SeqTrainer(model=make_tiny_t5(), args=args, optimizer_cls_and_kwargs=(torch.optim.SGD, {}))
    with pytest.raises(TypeError, match="HFLightningSeq2SeqTrainer.*'tokenzier'"):
        Seq2SeqTrainer(model=make_tiny_t5(), args=args, tokenzier=None)
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=1)
    with pytest.warns(FutureWarning, match="processing_class"):
        trainer = Seq2SeqTrainer(
            model=make_tiny_t5(), args=args, tokenizer=tokenizer, data_collator=pad_seq2seq_batch
        )
    assert trainer.processing_class is tokenizer


def test_arguments_must_be_seq2seq_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert isinstance(Seq2SeqTrainer(model=make_tiny_t5()).args, Seq2SeqTrainingArguments)
    with pytest.raises(ValueError, match="needs Seq2SeqTrainingArguments, got TrainingArguments"):
        Seq2SeqTrainer(model=make_tiny_t5(), args=TrainingArguments(output_dir="out", **BASE))
    reference_args = transformers.Seq2SeqTrainingArguments(
        output_dir="out", predict_with_generate=True, **BASE
    )
    trainer = Seq2SeqTrainer(model=make_tiny_t5(), args=reference_args)
    assert isinstance(trainer.args, Seq2SeqTrainingArguments) and trainer.args.predict_with_generate


# ---- generation config ---------------------------------------------------------------------------------------


def test_generation_config_from_a_folder_sets_the_padded_width(tmp_path):
    """S2S-6.1 check: a folder with max_length=9 → model.generation_config.max_length 9, predictions width 9."""
    transformers.GenerationConfig(
        max_length=9, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0
    ).save_pretrained(tmp_path / "gen")
    reference, ours = pair(tmp_path, predict_with_generate=True, generation_config=str(tmp_path / "gen"))
    assert ours.model.generation_config.max_length == reference.model.generation_config.max_length == 9
    data = seq2seq_data(5)
    output = ours.predict(data)
    assert output.predictions.shape == (5, 9)
    assert_predictions_equal(output, reference.predict(data))


def test_generation_config_from_a_file_an_object_or_an_invalid_config(tmp_path):
    config = transformers.GenerationConfig(max_length=7, num_beams=2)
    config.save_pretrained(tmp_path, config_file_name="my_generation.json")
    loaded = HFLightningSeq2SeqTrainer.load_generation_config(tmp_path / "my_generation.json")
    assert (loaded.max_length, loaded.num_beams) == (7, 2)
    copied = HFLightningSeq2SeqTrainer.load_generation_config(config)
    assert copied is not config and copied.to_dict() == config.to_dict()

    invalid = transformers.GenerationConfig(num_beams=1, early_stopping=True)
    with pytest.raises(ValueError) as reference_error:
        transformers.Seq2SeqTrainer.load_generation_config(invalid)
    with pytest.raises(ValueError) as our_error:
        HFLightningSeq2SeqTrainer.load_generation_config(invalid)
    assert str(our_error.value) == str(reference_error.value)
    assert str(our_error.value).endswith("Fix these issues to train your model.")

    with pytest.raises(ValueError, match=r"generation_config=\{'max_length': 7\} \(dict\) is not supported"):
        HFLightningSeq2SeqTrainer.load_generation_config({"max_length": 7})


# ---- generate() keywords --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "args", "expected"),
    [
        ({}, {}, {}),
        ({"max_length": 6}, {}, {"max_length": 6}),
        ({}, {"generation_max_length": 7, "generation_num_beams": 2}, {"max_length": 7, "num_beams": 2}),
        (
            {"max_new_tokens": 3, "num_beams": 1},
            {"generation_max_length": 7, "generation_num_beams": 2},
            {"max_new_tokens": 3, "num_beams": 1},
        ),
        (
            {"max_length": None, "num_beams": None},
            {"generation_max_length": 7, "generation_num_beams": 2},
            {"max_length": 7, "num_beams": 2},
        ),
        ({"max_length": None, "do_sample": False}, {}, {"max_length": None, "do_sample": False}),
    ],
)
def test_resolve_gen_kwargs(given, args, expected):
    """S2S-6.2: explicit keywords win; the arguments fill `max_length` (unless `max_new_tokens`) and `num_beams`."""
    arguments = SimpleNamespace(**{"generation_max_length": None, "generation_num_beams": None, **args})
    original = dict(given)
    assert resolve_gen_kwargs(given, arguments) == expected
    assert given == original  # the caller's dict is copied, not changed


@pytest.mark.parametrize(
    ("call", "args"),
    [
        ({}, {}),
        ({"max_length": 6}, {}),
        ({}, {"generation_max_length": 7, "generation_num_beams": 2}),
        ({"max_new_tokens": 3, "num_beams": 1}, {"generation_max_length": 7, "generation_num_beams": 2}),
    ],
)
def test_generate_receives_the_reference_keywords(tmp_path, call, args):
    """S2S-6.2 check: a spy on `model.generate` sees the same keywords (plus synced_gpus=False) in each call."""
    data = seq2seq_data(3)
    reference, ours = pair(tmp_path, spy=True, predict_with_generate=True, compute_metrics=width, **args)
    assert_predictions_equal(ours.predict(data, **call), reference.predict(data, **call))
    assert ours.model.generate.calls == reference.model.generate.calls
    assert len(ours.model.generate.calls) == 2 and ours.model.generate.calls[0]["synced_gpus"] is False


def test_no_generate_without_compute_metrics_or_predict_with_generate(tmp_path):
    """S2S-6.3: evaluate() without compute_metrics (prediction_loss_only) never generates; nor does False."""
    data = seq2seq_data(3)
    reference, ours = pair(tmp_path, spy=True, predict_with_generate=True)
    assert_metrics_match(ours.evaluate(data), reference.evaluate(data))
    assert ours.model.generate.calls == reference.model.generate.calls == []
    reference, ours = pair(tmp_path, spy=True, predict_with_generate=False)
    our_output, reference_output = ours.predict(data), reference.predict(data)
    assert_predictions_equal(our_output, reference_output)
    assert isinstance(our_output.predictions, tuple)  # logits and encoder states, no generation
    assert ours.model.generate.calls == reference.model.generate.calls == []


def test_explicit_prediction_step_keywords_replace_the_stored_ones(tmp_path):
    """S2S-6.3: keywords given to prediction_step win over `_gen_kwargs`; None num_beams / max_length dropped."""
    reference, ours = pair(tmp_path, spy=True, predict_with_generate=True, generation_num_beams=2)
    batch = pad_seq2seq_batch(list(seq2seq_data(2)))
    outputs = []
    for trainer in (reference, ours):
        trainer.evaluate(seq2seq_data(2), max_length=5)  # stores _gen_kwargs = {max_length: 5, num_beams: 2}
        trainer.model.generate.calls.clear()
        step = trainer.prediction_step(trainer.model, dict(batch), False, num_beams=None, max_new_tokens=2)
        outputs.append([None if t is None else t.numpy() for t in step])
    assert (
        ours.model.generate.calls
        == reference.model.generate.calls
        == [{"max_new_tokens": 2, "synced_gpus": False}]
    )
    assert_arrays_equal(outputs[1], outputs[0])


def test_generation_fills_the_model_generation_config_defaults(tmp_path):
    """S2S-6.3: after the first generation, unset fields of model.generation_config hold the library defaults."""
    reference, ours = pair(tmp_path, predict_with_generate=True, compute_metrics=width)
    assert ours.model.generation_config.max_length is None
    data = seq2seq_data(2)
    assert_predictions_equal(ours.predict(data), reference.predict(data))
    assert ours.model.generation_config.to_dict() == reference.model.generation_config.to_dict()
    assert ours.model.generation_config.max_length == 20


def test_loss_with_label_smoothing_or_loss_only(tmp_path):
    """S2S-6.3: the loss of the second forward (label smoother if set); `prediction_loss_only` → loss only."""
    data = seq2seq_data(3)
    reference, ours = pair(
        tmp_path / "smooth",
        predict_with_generate=True,
        compute_metrics=width,
        label_smoothing_factor=0.1,
        generation_max_length=4,
    )
    assert_predictions_equal(ours.predict(data), reference.predict(data))
    reference, ours = pair(
        tmp_path / "loss",
        spy=True,
        predict_with_generate=True,
        compute_metrics=width,
        prediction_loss_only=True,
    )
    assert_metrics_match(ours.evaluate(data), reference.evaluate(data))
    our_output = ours.predict(data)
    assert_predictions_equal(our_output, reference.predict(data))
    assert our_output.predictions is None and "test_loss" in our_output.metrics
    assert ours.model.generate.calls == reference.model.generate.calls == []


# ---- padding -------------------------------------------------------------------------------------------------


def test_pad_id_comes_from_the_processing_class_then_the_model(tmp_path):
    """S2S-6.3: processing class pad id (its EOS when pad is None), else model.config.pad_token_id, else error."""
    reference, ours = pair(tmp_path)
    tokens = torch.tensor([[5, 6], [7, 8]])
    for processing_class in (
        SimpleNamespace(pad_token_id=3),
        SimpleNamespace(pad_token_id=None, eos_token_id=1),
        None,
    ):
        reference.processing_class = ours.processing_class = processing_class
        expected = reference._pad_tensors_to_max_len(tokens, 4)
        assert torch.equal(ours._pad_tensors_to_max_len(tokens, 4), expected)
    assert ours._pad_tensors_to_max_len(tokens, 4)[0].tolist() == [5, 6, 0, 0]
    reference.model.config.pad_token_id = ours.model.config.pad_token_id = None
    with pytest.raises(ValueError) as reference_error:
        reference._pad_tensors_to_max_len(tokens, 4)
    with pytest.raises(ValueError, match="Pad_token_id must be set") as our_error:
        ours._pad_tensors_to_max_len(tokens, 4)
    assert str(our_error.value) == str(reference_error.value)


# ---- models that cannot generate -----------------------------------------------------------------------------


class Seq2SeqRegressor(nn.Module):
    """A plain module that takes seq2seq batches but has no `generate()`."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(40, 4)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.embed(input_ids).mean(1)
        return {"loss": logits.pow(2).mean(), "logits": logits}


def test_a_model_without_generate_gets_a_clear_error(tmp_path):
    data = seq2seq_data(3)

    def trainer(predict_with_generate):
        args = Seq2SeqTrainingArguments(
            output_dir=str(tmp_path), predict_with_generate=predict_with_generate, **BASE
        )
        return Seq2SeqTrainer(
            model=Seq2SeqRegressor(), args=args, data_collator=pad_seq2seq_batch, compute_metrics=width
        )

    with pytest.raises(
        ValueError, match=r"predict_with_generate=True needs a model with a `generate\(\)` method"
    ):
        trainer(True).predict(data)
    assert trainer(False).predict(data).predictions.shape == (3, 4)

    generating = trainer(True)
    generating.model.generate = lambda **kwargs: kwargs["input_ids"]
    with pytest.raises(ValueError, match="has no `generation_config`"):
        generating.predict(data)
    generating.model.generation_config = SimpleNamespace(max_length=None)
    with pytest.raises(ValueError, match=r"generation_config.max_length=None"):
        generating.predict(data)


# ---- registry --------------------------------------------------------------------------------------------------


def test_registry_notes_of_the_generation_fields(tmp_path):
    def notes(**kwargs):
        plan = translate(Seq2SeqTrainingArguments(output_dir=str(tmp_path), **BASE, **kwargs))
        fields = (
            "predict_with_generate",
            "generation_max_length",
            "generation_num_beams",
            "generation_config",
        )
        return {name: plan.notes[name].status for name in fields}

    assert notes() == dict.fromkeys(notes(), "not-applicable")
    generating = notes(predict_with_generate=True, generation_num_beams=2, generation_config="some/model")
    assert generating == {
        "predict_with_generate": "honoured",
        "generation_max_length": "not-applicable",
        "generation_num_beams": "honoured",
        "generation_config": "honoured",
    }
    assert notes(generation_num_beams=2)["generation_num_beams"] == "not-applicable"


# ---- without transformers ----------------------------------------------------------------------------------------

_WITHOUT_TRANSFORMERS = textwrap.dedent(
    """
    import sys
    from types import SimpleNamespace

    import torch
    from torch import nn

    from hf_lightning import Seq2SeqTrainer, Seq2SeqTrainingArguments


    class Echo(nn.Module):
        '''A plain module that "generates" its inputs plus one, with a duck-typed generation config.'''

        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(()))
            self.config = SimpleNamespace(pad_token_id=0)
            self.generation_config = SimpleNamespace(max_length=6, max_new_tokens=None)

        def forward(self, input_ids, labels=None):
            loss = (self.scale * input_ids.float()).mean()
            return {"loss": loss, "logits": input_ids.float()}

        def generate(self, input_ids, labels=None, synced_gpus=False, num_beams=1):
            return input_ids + num_beams


    data = [{"input_ids": torch.tensor([i + 2, i + 3]), "labels": torch.tensor([1, 2, 3])} for i in range(3)]
    args = Seq2SeqTrainingArguments(
        output_dir="out", use_cpu=True, report_to="none", disable_tqdm=True, per_device_eval_batch_size=2,
        predict_with_generate=True, generation_num_beams=2,
    )
    trainer = Seq2SeqTrainer(model=Echo(), args=args, compute_metrics=lambda p: {"n": p.predictions.shape[0]})
    output = trainer.predict(data)
    assert output.predictions.tolist()[0] == [4, 5, 0, 0, 0, 0], output.predictions
    assert output.label_ids.shape == (3, 6) and output.metrics["test_n"] == 3, output
    assert "test_loss" in output.metrics
    try:
        Seq2SeqTrainer(model=Echo(), args=Seq2SeqTrainingArguments(
            output_dir="out", use_cpu=True, report_to="none", generation_config="a/model"))
    except ImportError as error:
        assert 'pip install -e ".[transformers]"' in str(error), error
        assert "generation_config='a/model'" in str(error), error
    else:
        raise AssertionError("no ImportError")
    assert not any(name.split(".")[0] in ("transformers", "accelerate") for name in sys.modules)
    print("ok")
    """
)


def test_generation_without_transformers(tmp_path):
    """A plain module with `generate()` runs without transformers; a config path names the extra to install."""
    result = subprocess.run(
        [sys.executable, "-c", BLOCK_TRANSFORMERS + _WITHOUT_TRANSFORMERS],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
