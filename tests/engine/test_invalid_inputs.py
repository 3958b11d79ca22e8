"""Bad inputs that need the model or the data are refused when the Trainer is built, naming the field or the
dataset; the reference, run on the same input in the same test, fails on each of them in its `train()`.
Also the run-length cases of docs/divergences.md (max_steps=0, num_train_epochs <= 0, an empty iterable
dataset), report_to=None and the CUBLAS_WORKSPACE_CONFIG value of full_determinism, against the reference."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
import transformers
from torch.utils.data import Dataset, IterableDataset

from hf_lightning import TrainingArguments
from hf_lightning.args.validation import InvalidArgumentsError
from hf_lightning.data.collate import default_data_collator as hf_lightning_default_collator
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.models import make_regression_mlp, regression_data


class EmptyMap(Dataset):
    def __len__(self) -> int:
        return 0

    def __getitem__(self, index: int) -> dict:
        raise IndexError(index)


class EmptyIterable(IterableDataset):
    def __iter__(self):
        return iter(())


@pytest.fixture(autouse=True)
def _quiet_reference():
    previous = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    transformers.logging.set_verbosity(previous)


def _args(cls: type, out: str, **fields):
    base = {"output_dir": out, "use_cpu": True, "report_to": "none", "save_strategy": "no", "disable_tqdm": True}
    return cls(**{**base, **fields})


def _file(tmp_path) -> str:
    path = tmp_path / "a_file"
    path.write_text("not a folder")
    return str(path)


# (case id, argument fields, trainer keywords, the field or input the message names)
TRAINER_CASES = [
    ("neftune without input embeddings", {"neftune_noise_alpha": 5.0}, {}, "neftune_noise_alpha"),
    ("empty map-style train dataset", {}, {"train_dataset": EmptyMap()}, "train_dataset"),
    ("lr_scheduler_kwargs the schedule does not take", {"lr_scheduler_kwargs": {"foo": 1}}, {}, "lr_scheduler_kwargs"),
    (
        "warmup_stable_decay without num_decay_steps",
        {"lr_scheduler_type": "warmup_stable_decay", "lr_scheduler_kwargs": {"num_stable_steps": 2}},
        {},
        "lr_scheduler_kwargs",
    ),
    ("cosine_with_min_lr without min_lr", {"lr_scheduler_type": "cosine_with_min_lr"}, {}, "lr_scheduler_kwargs"),
    ("eval_on_start without eval data", {"eval_on_start": True}, {}, "eval_on_start"),
    ("persistent workers without workers", {"dataloader_persistent_workers": True}, {}, "dataloader_persistent_workers"),
    (
        "multiprocessing context without workers",
        {"dataloader_multiprocessing_context": "spawn"},
        {},
        "dataloader_multiprocessing_context",
    ),
]


def _reference_failure(tmp_path, arg_fields: dict, trainer_kwargs: dict) -> BaseException | None:
    """Build and train the reference on the input; the exception it meets (None: it trained)."""
    try:
        args = _args(transformers.TrainingArguments, str(tmp_path / "ref"), **arg_fields)
        kwargs = {"model": make_regression_mlp(), "args": args, "train_dataset": regression_data(8), **trainer_kwargs}
        transformers.Trainer(**kwargs).train()
    except Exception as error:  # noqa: BLE001 - the reference's own failure, whatever its type
        return error
    return None


@pytest.mark.parametrize(
    ("case", "arg_fields", "trainer_kwargs", "field"), TRAINER_CASES, ids=[c[0] for c in TRAINER_CASES]
)
def test_refused_at_trainer_construction_naming_it(tmp_path, case, arg_fields, trainer_kwargs, field):
    reference = _reference_failure(tmp_path, arg_fields, trainer_kwargs)
    assert reference is not None, f"the reference trains with {case}"
    args = _args(TrainingArguments, str(tmp_path / "ours"), **arg_fields)
    kwargs = {"model": make_regression_mlp(), "args": args, "train_dataset": regression_data(8), **trainer_kwargs}
    with pytest.raises(InvalidArgumentsError) as info:
        HFLightningTrainer(**kwargs)
    assert info.value.fields == [field] and f"  - {field}: " in str(info.value)
    assert isinstance(info.value, type(reference)), (case, reference)  # the reference's type is kept


def test_a_value_assigned_after_construction_is_checked_by_the_trainer(tmp_path):
    args = _args(TrainingArguments, str(tmp_path / "ours"))
    args.learning_rate = "fast"
    args.gradient_accumulation_steps = 0
    with pytest.raises(InvalidArgumentsError) as info:
        HFLightningTrainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(8))
    assert info.value.fields == ["learning_rate", "gradient_accumulation_steps"]


def test_output_dir_an_existing_file_is_refused_at_construction(tmp_path):
    path = _file(tmp_path)
    with pytest.raises(FileExistsError):  # the reference's makedirs, at its construction
        transformers.Trainer(model=make_regression_mlp(), args=_args(transformers.TrainingArguments, path))
    with pytest.raises(ValueError, match="output_dir"):
        HFLightningTrainer(model=make_regression_mlp(), args=_args(TrainingArguments, path))


def test_the_model_and_data_problems_come_in_one_error(tmp_path):
    args = _args(TrainingArguments, str(tmp_path / "ours"), neftune_noise_alpha=5.0, lr_scheduler_kwargs={"x": 1})
    with pytest.raises(InvalidArgumentsError) as info:
        HFLightningTrainer(model=make_regression_mlp(), args=args, train_dataset=EmptyMap())
    assert info.value.fields == ["neftune_noise_alpha", "train_dataset", "lr_scheduler_kwargs"]


def test_a_model_with_input_embeddings_takes_neftune(tmp_path):
    from tests.models import make_tiny_bert_classifier

    args = _args(TrainingArguments, str(tmp_path / "ours"), neftune_noise_alpha=5.0)
    HFLightningTrainer(model=make_tiny_bert_classifier(), args=args)


def test_schedule_kwargs_it_takes_are_accepted(tmp_path):
    args = _args(TrainingArguments, str(tmp_path / "ours"), lr_scheduler_type="cosine", lr_scheduler_kwargs={"num_cycles": 1.0})
    HFLightningTrainer(model=make_regression_mlp(), args=args)
    # constant schedules take no keyword arguments and ignore them, in the reference too
    args = _args(TrainingArguments, str(tmp_path / "ours"), lr_scheduler_type="constant", lr_scheduler_kwargs={"x": 1})
    HFLightningTrainer(model=make_regression_mlp(), args=args)


# ------------------------------------------------------------------------------------- run length


def _steps(cls_args: type, cls_trainer: type, out: str, train_dataset=None, **fields) -> int:
    args = _args(cls_args, out, **fields)
    trainer = cls_trainer(model=make_regression_mlp(), args=args, train_dataset=train_dataset or regression_data(8))
    return trainer.train().global_step


def test_max_steps_zero_makes_one_step_in_the_reference_and_is_refused_here(tmp_path):
    reference = _steps(transformers.TrainingArguments, transformers.Trainer, str(tmp_path / "ref"), max_steps=0)
    assert reference == 1  # its loop checks the bound after the first update (docs/divergences.md)
    with pytest.raises(ValueError, match="max_steps"):
        _args(TrainingArguments, str(tmp_path / "ours"), max_steps=0)


def test_zero_epochs_train_no_step_like_the_reference(tmp_path):
    ours = _steps(TrainingArguments, HFLightningTrainer, str(tmp_path / "ours"), num_train_epochs=0)
    reference = _steps(transformers.TrainingArguments, transformers.Trainer, str(tmp_path / "ref"), num_train_epochs=0)
    assert ours == reference == 0


def test_negative_epochs_train_no_step_in_the_reference_and_are_refused_here(tmp_path):
    reference = _steps(transformers.TrainingArguments, transformers.Trainer, str(tmp_path / "ref"), num_train_epochs=-1)
    assert reference == 0
    with pytest.raises(ValueError, match="num_train_epochs"):
        _args(TrainingArguments, str(tmp_path / "ours"), num_train_epochs=-1)
    # unused when max_steps is set, in both
    assert _steps(TrainingArguments, HFLightningTrainer, str(tmp_path / "ours"), num_train_epochs=-1, max_steps=2) == 2


def test_empty_iterable_dataset_with_max_steps_raises_like_the_reference(tmp_path):
    with pytest.raises(ValueError):
        _steps(transformers.TrainingArguments, transformers.Trainer, str(tmp_path / "ref"), EmptyIterable(), max_steps=3)
    with pytest.raises(ValueError, match="train_dataset: the EmptyIterable yielded no batch in epoch 0"):
        _steps(TrainingArguments, HFLightningTrainer, str(tmp_path / "ours"), EmptyIterable(), max_steps=3)


def test_report_to_none_refused_by_the_reference_trainer_and_by_our_arguments(tmp_path):
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "ref"), use_cpu=True, report_to=None)
    with pytest.raises(ValueError, match="None is not supported"):
        transformers.Trainer(model=make_regression_mlp(), args=args)
    with pytest.raises(ValueError, match="report_to"):
        TrainingArguments(output_dir=str(tmp_path / "ours"), use_cpu=True, report_to=None)


def test_full_determinism_sets_the_reference_cublas_workspace_config(tmp_path, monkeypatch):
    from transformers.trainer_utils import enable_full_determinism

    try:
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
        enable_full_determinism(0)
        reference = os.environ["CUBLAS_WORKSPACE_CONFIG"]
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
        HFLightningTrainer(model=make_regression_mlp(), args=_args(TrainingArguments, str(tmp_path), full_determinism=True))
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == reference == ":16:8"
    finally:
        torch.use_deterministic_algorithms(False)


def test_label_smoothing_on_float_labels_names_the_field(tmp_path):
    from hf_lightning.engine.loss import LabelSmoother

    smoother = LabelSmoother(epsilon=0.5)
    labels = torch.tensor([0, 1])
    assert torch.isfinite(smoother({"logits": torch.randn(2, 3)}, labels))  # class indices: fine
    with pytest.raises(ValueError, match="label_smoothing_factor=0.5") as info:
        smoother({"logits": torch.randn(2, 3)}, labels.float())
    assert isinstance(info.value, RuntimeError)  # the reference's gather raises RuntimeError here
    args = _args(TrainingArguments, str(tmp_path / "ours"), label_smoothing_factor=0.5, max_steps=1)
    trainer = HFLightningTrainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(8))
    with pytest.raises(ValueError, match="label_smoothing_factor"):
        trainer.train()


def test_a_missing_schedule_key_is_named_with_the_fix(tmp_path):
    args = _args(TrainingArguments, str(tmp_path / "ours"), lr_scheduler_type="warmup_stable_decay")
    with pytest.raises(TypeError, match=r"'warmup_stable_decay' schedule needs 'num_decay_steps'") as info:
        HFLightningTrainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(8))
    assert "lr_scheduler_kwargs={'num_decay_steps': ...}" in str(info.value)
    args = _args(
        TrainingArguments, str(tmp_path / "ours"), lr_scheduler_type="warmup_stable_decay", max_steps=4,
        lr_scheduler_kwargs='{"num_decay_steps": 2}',
    )  # fmt: skip
    HFLightningTrainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(8)).train()


def test_text_schedule_kwargs_assigned_after_construction_are_checked_by_the_trainer(tmp_path):
    args = _args(TrainingArguments, str(tmp_path / "ours"))
    args.lr_scheduler_kwargs = "num_cycles=2"
    with pytest.raises(InvalidArgumentsError, match="not a JSON object") as info:
        HFLightningTrainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(8))
    assert info.value.fields == ["lr_scheduler_kwargs"] and isinstance(info.value, TypeError)


class Texts(Dataset):
    """Raw examples as a newcomer's first dataset holds them: text, or dicts of text only."""

    def __init__(self, items: list):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        return self.items[index]


RAW_DATASETS = {
    "strings": (["the sky is blue", "the grass is green"], "'the sky is blue' is text, not a dict"),
    "dicts of text": ([{"text": "the sky is blue"}, {"text": "the grass is green"}], "{'text': 'the sky is blue'} is a dict with no model inputs"),
    "tuples": ([(torch.ones(4), torch.tensor(1.0))] * 2, "(tensor([1., 1., 1., 1.]), tensor(1.)) is a tuple, not"),
    "text and labels": (
        [{"text": "the sky is blue", "labels": 1.0}, {"text": "the grass is green", "labels": 0.0}],
        "{'text': 'the sky is blue', 'labels': 1.0} is a dict of text and labels, with no model inputs",
    ),
}


@pytest.mark.parametrize("kind", list(RAW_DATASETS))
def test_raw_examples_without_a_collator_are_refused_when_the_trainer_is_built(tmp_path, kind):
    """The reference builds the trainer and fails at its first step with torch's or the model's error."""
    items, shown = RAW_DATASETS[kind]
    reference = _reference_failure(tmp_path, {"max_steps": 1}, {"train_dataset": Texts(items)})
    assert isinstance(reference, (TypeError, ValueError)), reference
    assert "train_dataset" not in str(reference)
    args = _args(TrainingArguments, str(tmp_path / "ours"), max_steps=1)
    with pytest.raises(InvalidArgumentsError) as info:
        HFLightningTrainer(model=make_regression_mlp(), args=args, train_dataset=Texts(items))
    assert info.value.fields == ["train_dataset"]
    assert f"train_dataset[0] = {shown}" in str(info.value) and "data_collator" in str(info.value)
    # The eval set too (one of a dict of them here), in the same error.
    with pytest.raises(InvalidArgumentsError) as info:
        HFLightningTrainer(
            model=make_regression_mlp(), args=args, train_dataset=Texts(items), eval_dataset={"dev": Texts(items)}
        )
    assert info.value.fields == ["train_dataset", "eval_dataset['dev']"]


def test_raw_examples_with_a_collator_or_with_inputs_next_to_text_are_accepted(tmp_path):
    args = _args(TrainingArguments, str(tmp_path / "ours"), max_steps=1)
    items = [{"text": "a", **item} for item in regression_data(4).items]  # text dropped, x and labels kept
    HFLightningTrainer(model=make_regression_mlp(), args=args, train_dataset=Texts(items)).train()

    def collate(texts: list[str]) -> dict:
        return {"x": torch.ones(len(texts), 4), "labels": torch.tensor([float(len(t)) for t in texts])}

    trainer = HFLightningTrainer(
        model=make_regression_mlp(), args=args, train_dataset=Texts(["ab", "abc"]), data_collator=collate
    )
    assert trainer.train().global_step == 1


class RandomlyAugmented(Dataset):
    """Draws from the global RNGs when an example is read, as a random augmentation does."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> dict:
        import random

        import numpy as np

        noise = torch.rand(4) + random.random() + float(np.random.rand())
        return {"x": noise, "labels": torch.tensor(float(index))}


def test_looking_at_the_first_example_leaves_the_random_streams_as_they_were(tmp_path):
    import random

    import numpy as np

    args = _args(TrainingArguments, str(tmp_path / "ours"), max_steps=1)
    HFLightningTrainer(model=make_regression_mlp(), args=args, train_dataset=RandomlyAugmented())
    # The constructor seeds (as the reference's); the next draws are the seed's first ones.
    after = (torch.rand(1).item(), random.random(), float(np.random.rand()))
    torch.manual_seed(args.seed), random.seed(args.seed), np.random.seed(args.seed)
    assert after == (torch.rand(1).item(), random.random(), float(np.random.rand()))


def _classification_rows(label_values) -> Texts:
    from tests.models import classification_data

    rows = [dict(item) for item in classification_data(4).items]
    for row, value in zip(rows, label_values):
        row.pop("labels", None)
        if value is not None:
            row["label"] = value
    return Texts(rows)


@pytest.mark.parametrize(
    ("case", "labels", "expected"),
    [
        ("no label column", [None] * 4, "train_dataset[0] has no 'labels' column"),
        ("text labels", ["positive", "negative", "positive", "negative"], "train_dataset[0]['label'] = 'positive' is text"),
    ],
)
def test_data_mistakes_the_first_example_shows_are_named_before_training(tmp_path, case, labels, expected):
    """Named when train() starts, before its first step (a trainer built to evaluate or predict may hold such data).
    The reference fails at its first step ("The model did not return a loss from the
    inputs, only the following keys: logits"; "too many dimensions 'str'")."""
    from tests.models import make_tiny_bert_classifier

    data = _classification_rows(labels)
    reference_args = _args(transformers.TrainingArguments, str(tmp_path / "ref"), max_steps=1)
    with pytest.raises((ValueError, TypeError)) as reference:
        transformers.Trainer(model=make_tiny_bert_classifier(), args=reference_args, train_dataset=data).train()
    assert "train_dataset" not in str(reference.value)
    args = _args(TrainingArguments, str(tmp_path / "ours"), max_steps=1)
    trainer = HFLightningTrainer(model=make_tiny_bert_classifier(), args=args, train_dataset=data)
    if case == "no label column":
        trainer.predict(data)  # a trainer used to predict needs no labels: nothing is said
    with pytest.raises(InvalidArgumentsError) as info:
        trainer.train()
    assert trainer.state.global_step == 0 and info.value.fields == ["train_dataset"]
    assert expected in str(info.value)
    assert ("label_names" in str(info.value)) if case == "no label column" else ("class_encode_column" in str(info.value))


DEFAULT_COLLATORS = {
    "transformers.default_data_collator": lambda: transformers.default_data_collator,
    "transformers.DefaultDataCollator": lambda: transformers.DefaultDataCollator(),
    "hf_lightning's default_data_collator": lambda: hf_lightning_default_collator,
    "transformers.DataCollatorWithPadding": lambda: transformers.DataCollatorWithPadding(_word_tokenizer()),
}


def _word_tokenizer():
    from tests.trl.tiny import make_tokenizer  # a word-level tokenizer built in-process

    return make_tokenizer()


@pytest.mark.parametrize("collator", list(DEFAULT_COLLATORS))
def test_data_mistakes_are_named_before_training_when_a_default_collator_is_passed_too(tmp_path, collator):
    """A default collator given as `data_collator=` (as tutorials do) batches the first example as the trainer's own
    pick would: the reference fails at its first step, we name the data when the trainer is built or train() starts."""
    from tests.models import make_tiny_bert_classifier

    text_labels = _classification_rows(["positive", "negative", "positive", "negative"])
    reference_args = _args(transformers.TrainingArguments, str(tmp_path / "ref"), max_steps=1)
    with pytest.raises((ValueError, TypeError)) as reference:
        transformers.Trainer(
            model=make_tiny_bert_classifier(), args=reference_args, train_dataset=text_labels,
            data_collator=DEFAULT_COLLATORS[collator](),
        ).train()  # fmt: skip
    assert "train_dataset" not in str(reference.value)
    args = _args(TrainingArguments, str(tmp_path / "ours"), max_steps=1)
    trainer = HFLightningTrainer(
        model=make_tiny_bert_classifier(), args=args, train_dataset=text_labels, data_collator=DEFAULT_COLLATORS[collator]()
    )
    with pytest.raises(InvalidArgumentsError, match=r"train_dataset\[0\]\['label'\] = 'positive' is text"):
        trainer.train()
    assert trainer.state.global_step == 0
    unlabelled = _classification_rows([None] * 4)
    trainer = HFLightningTrainer(
        model=make_tiny_bert_classifier(), args=args, train_dataset=unlabelled, data_collator=DEFAULT_COLLATORS[collator]()
    )
    with pytest.raises(InvalidArgumentsError, match=r"train_dataset\[0\] has no 'labels' column"):
        trainer.train()
    raw = Texts(RAW_DATASETS["text and labels"][0])
    with pytest.raises(InvalidArgumentsError) as info:
        HFLightningTrainer(
            model=make_regression_mlp(), args=args, train_dataset=raw, data_collator=DEFAULT_COLLATORS[collator]()
        )
    assert info.value.fields == ["train_dataset"]


def test_labels_under_another_name_a_collator_or_a_loss_function_are_accepted(tmp_path):
    from tests.models import make_tiny_bert_classifier

    args = _args(TrainingArguments, str(tmp_path / "ours"), max_steps=1)
    with_label = _classification_rows([0, 1, 0, 1])  # "label": the collator renames it
    assert HFLightningTrainer(model=make_tiny_bert_classifier(), args=args, train_dataset=with_label).train().global_step == 1
    unlabelled = _classification_rows([None] * 4)

    def loss(outputs, labels, num_items_in_batch=None):
        return outputs["logits"].float().pow(2).mean()

    trained = HFLightningTrainer(
        model=make_tiny_bert_classifier(), args=args, train_dataset=unlabelled, compute_loss_func=loss
    ).train()
    assert trained.global_step == 1
    collated = HFLightningTrainer(
        model=make_tiny_bert_classifier(), args=args, train_dataset=unlabelled,
        data_collator=lambda rows: {**transformers.default_data_collator(rows), "labels": torch.zeros(len(rows), dtype=torch.long)},
    ).train()  # fmt: skip
    assert collated.global_step == 1
