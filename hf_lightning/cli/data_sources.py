"""The `data:` section of `hf-lightning fit | validate | test | predict`: its protocol and the embedded tasks.

A `data:` class is either a `lightning.LightningDataModule` or any class that follows the `DataSource`
protocol: it declares `train_dataset`, `eval_dataset`, `test_dataset` and `data_collator` in its class body
(annotations are enough; the values are set on the instance, `None` where a split does not exist). Optional
attributes: `predict_dataset` (what `predict` runs on; `test_dataset` otherwise), `processing_class` (saved with
the model, used to decode generated text) and `compute_metrics`. The embedded tasks below follow it, so the
example configs run offline.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from hf_lightning.cli.embedded import (
    FILLER_WORDS,
    MAX_LENGTH,
    SPECIAL_TOKENS,
    TOPIC_WORDS,
    TOPICS,
    EmbeddedCollator,
    EmbeddedDataset,
    EmbeddedTokenizer,
    accuracy_metric,
    generate_examples,
)

DATA_SOURCE_ATTRIBUTES: tuple[str, ...] = ("train_dataset", "eval_dataset", "test_dataset", "data_collator")
STAGES: tuple[str, ...] = ("fit", "validate", "test", "predict")

EOS_TOKEN = "[EOS]"
# The embedded tasks share one fixed vocabulary (special tokens, [EOS], topic names, every word the generator
# can draw), so a model config in YAML can name its size: CLI_VOCAB_SIZE.
CLI_VOCABULARY: tuple[str, ...] = (
    *SPECIAL_TOKENS,
    EOS_TOKEN,
    *TOPICS,
    *sorted({word for words in TOPIC_WORDS.values() for word in words} | set(FILLER_WORDS)),
)
CLI_VOCAB_SIZE = len(CLI_VOCABULARY)
EOS_TOKEN_ID = CLI_VOCABULARY.index(EOS_TOKEN)
IGNORE_INDEX = -100


class DataSource(abc.ABC):
    """The `data:` protocol: a class declaring `train_dataset`, `eval_dataset`, `test_dataset`, `data_collator`.

    Subclassing is optional: any class whose body declares the four names (an annotation such as
    `train_dataset: Dataset | None` suffices) counts as one, so the config parser can accept it by its import path.
    """

    train_dataset: Dataset | None
    eval_dataset: Dataset | None
    test_dataset: Dataset | None
    data_collator: Callable | None

    @classmethod
    def __subclasshook__(cls, other: type) -> bool:
        if cls is not DataSource:
            return NotImplemented
        # Declared in the class body (attribute, property or annotation) of the class or a base.
        declared: set[str] = set()
        for klass in getattr(other, "__mro__", ()):
            namespace = vars(klass)
            annotations = namespace.get("__annotations__")
            declared |= set(namespace) | (set(annotations) if isinstance(annotations, dict) else set())
        return True if set(DATA_SOURCE_ATTRIBUTES) <= declared else NotImplemented


@dataclass
class DataParts:
    """What one command takes from the `data:` object: datasets, collator, processing class and metric."""

    train_dataset: Any = None
    eval_dataset: Any = None
    test_dataset: Any = None
    predict_dataset: Any = None
    data_collator: Callable | None = None
    processing_class: Any = None
    compute_metrics: Callable | None = None


def resolve_data(data: Any, stage: str) -> DataParts:
    """The datasets and collator of `data` (a LightningDataModule or a `DataSource`) for one stage.

    A LightningDataModule gets `prepare_data()` and `setup(stage)`; its protocol attributes are used when it has
    them, otherwise the `.dataset` and `.collate_fn` of its `*_dataloader()` hooks (the loader's batch size and
    order are not used: `per_device_*_batch_size` and the reference's samplers apply).
    """
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r} is not one of {list(STAGES)}.")
    import lightning.pytorch as pl

    if isinstance(data, pl.LightningDataModule):
        return _from_datamodule(data, stage)
    missing = [name for name in DATA_SOURCE_ATTRIBUTES if not hasattr(data, name)]
    if missing:
        raise ValueError(
            f"data: {type(data).__name__} has no attribute {', '.join(missing)}; a `data:` class must be a "
            f"LightningDataModule or set {', '.join(DATA_SOURCE_ATTRIBUTES)} (None where absent)."
        )
    parts = DataParts(
        train_dataset=data.train_dataset,
        eval_dataset=data.eval_dataset,
        test_dataset=data.test_dataset,
        predict_dataset=getattr(data, "predict_dataset", None),
        data_collator=data.data_collator,
        processing_class=getattr(data, "processing_class", None),
        compute_metrics=getattr(data, "compute_metrics", None),
    )
    return parts


_DATAMODULE_HOOKS = {
    "train_dataset": "train_dataloader",
    "eval_dataset": "val_dataloader",
    "test_dataset": "test_dataloader",
    "predict_dataset": "predict_dataloader",
}
# The splits each stage reads from a LightningDataModule (the first one's loader gives the collator).
_STAGE_SPLITS = {
    "fit": ("train_dataset", "eval_dataset"),
    "validate": ("eval_dataset",),
    "test": ("test_dataset",),
    "predict": ("predict_dataset", "test_dataset"),
}


def _from_datamodule(datamodule: Any, stage: str) -> DataParts:
    import lightning.pytorch as pl
    from lightning.pytorch.utilities.model_helpers import is_overridden
    from torch.utils.data import default_collate

    datamodule.prepare_data()
    datamodule.setup(stage)
    parts = DataParts(
        data_collator=getattr(datamodule, "data_collator", None),
        processing_class=getattr(datamodule, "processing_class", None),
        compute_metrics=getattr(datamodule, "compute_metrics", None),
    )
    loader_collators = []
    for split in _STAGE_SPLITS[stage]:
        dataset = getattr(datamodule, split, None)
        hook = _DATAMODULE_HOOKS[split]
        if dataset is None and is_overridden(hook, datamodule, pl.LightningDataModule):
            loader = getattr(datamodule, hook)()
            dataset = loader.dataset
            loader_collators.append(loader.collate_fn)
        setattr(parts, split, dataset)
    if parts.data_collator is None and loader_collators and loader_collators[0] is not default_collate:
        parts.data_collator = loader_collators[0]
    return parts


# ----------------------------------------------------------------------------------------------
# The embedded tasks (generated in-process from a seed; nothing downloaded)
# ----------------------------------------------------------------------------------------------


class CLITokenizer(EmbeddedTokenizer):
    """The embedded word-level tokenizer plus an end-of-sequence token `[EOS]`, which `decode` also skips."""

    def __init__(self, vocab: dict[str, int], model_max_length: int = MAX_LENGTH) -> None:
        super().__init__(vocab, model_max_length=model_max_length)
        if EOS_TOKEN not in self.vocab:
            raise ValueError(f"vocab has no {EOS_TOKEN!r} token; build it with cli_tokenizer().")
        self.eos_token, self.eos_token_id = EOS_TOKEN, self.vocab[EOS_TOKEN]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Ids back to space-separated words; special tokens, `[EOS]` included, are dropped by default."""
        ids = [int(index) for index in ids]
        if skip_special_tokens:
            ids = [index for index in ids if index != self.eos_token_id]
        return super().decode(ids, skip_special_tokens=skip_special_tokens)


def cli_tokenizer() -> CLITokenizer:
    """The tokenizer of the embedded tasks, over `CLI_VOCABULARY` (the same ids for every seed and split)."""
    return CLITokenizer({token: index for index, token in enumerate(CLI_VOCABULARY)})


def _split_datasets(
    seed: int, sizes: tuple[int, int, int], make_dataset: Callable[[list[dict[str, Any]]], Dataset]
) -> tuple[Dataset, Dataset, Dataset]:
    """The train / eval / test datasets made from the embedded examples of each split (sizes in that order)."""
    train, evaluation, test = (
        make_dataset(generate_examples(size, seed, split))
        for split, size in zip(("train", "eval", "test"), sizes)
    )
    return train, evaluation, test


class EmbeddedClassificationData(DataSource):
    """The embedded topic-classification task (4 topics, chance 25%); metric `accuracy`."""

    def __init__(
        self, train_size: int = 2000, eval_size: int = 200, test_size: int = 200, seed: int = 42
    ) -> None:
        self.processing_class = tokenizer = cli_tokenizer()
        self.train_dataset, self.eval_dataset, self.test_dataset = _split_datasets(
            seed, (train_size, eval_size, test_size), lambda examples: EmbeddedDataset(examples, tokenizer)
        )
        self.data_collator = EmbeddedCollator(self.processing_class.pad_token_id)
        self.compute_metrics = accuracy_metric


class TokenListDataset(Dataset):
    """A list of `{"input_ids": [...], "labels": [...]}` items (labels optional)."""

    def __init__(self, items: Sequence[dict[str, list[int]]]) -> None:
        self.items = list(items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return {key: list(value) for key, value in self.items[index].items()}


class PaddingCollator:
    """Right-pads `input_ids` with `pad_token_id` (adding `attention_mask`) and `labels` with -100.

    Without `labels` in the items, `labels` are a copy of `input_ids` with -100 on padding (causal LM: the model
    shifts them itself).
    """

    def __init__(self, pad_token_id: int = 0) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, features: Sequence[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        input_ids = _pad([feature["input_ids"] for feature in features], self.pad_token_id)
        attention_mask = _pad([[1] * len(feature["input_ids"]) for feature in features], 0)
        if "labels" in features[0]:
            labels = _pad([feature["labels"] for feature in features], IGNORE_INDEX)
        else:
            labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def _pad(rows: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    longest = max(len(row) for row in rows)
    return torch.tensor([list(row) + [value] * (longest - len(row)) for row in rows], dtype=torch.long)


class EmbeddedCausalLMData(DataSource):
    """The embedded sentences as a causal-LM task: `[CLS] words [EOS]`, the loss on every real token."""

    def __init__(
        self, train_size: int = 2000, eval_size: int = 200, test_size: int = 200, seed: int = 42
    ) -> None:
        self.processing_class = tokenizer = cli_tokenizer()

        def dataset(examples: list[dict[str, Any]]) -> TokenListDataset:
            return TokenListDataset(
                [{"input_ids": tokenizer.encode(ex["text"])["input_ids"] + [EOS_TOKEN_ID]} for ex in examples]
            )

        self.train_dataset, self.eval_dataset, self.test_dataset = _split_datasets(
            seed, (train_size, eval_size, test_size), dataset
        )
        self.data_collator = PaddingCollator(tokenizer.pad_token_id)


class EmbeddedSeq2SeqData(DataSource):
    """The embedded task as seq2seq: the sentence in, its topic's name and `[EOS]` out; metric `topic_accuracy`."""

    def __init__(
        self, train_size: int = 2000, eval_size: int = 200, test_size: int = 200, seed: int = 42
    ) -> None:
        self.processing_class = tokenizer = cli_tokenizer()

        def dataset(examples: list[dict[str, Any]]) -> TokenListDataset:
            return TokenListDataset(
                [
                    {
                        "input_ids": tokenizer.encode(ex["text"])["input_ids"],
                        "labels": [tokenizer.vocab[TOPICS[ex["label"]]], EOS_TOKEN_ID],
                    }
                    for ex in examples
                ]
            )

        self.train_dataset, self.eval_dataset, self.test_dataset = _split_datasets(
            seed, (train_size, eval_size, test_size), dataset
        )
        self.data_collator = PaddingCollator(tokenizer.pad_token_id)
        self.compute_metrics = topic_accuracy


def topic_accuracy(eval_pred: Any) -> dict[str, float]:
    """Share of examples whose first generated token (padding skipped) is the label's topic token.

    Accepts generated ids (`predict_with_generate=True`) or logits (their argmax is taken).
    """
    predictions = eval_pred.predictions
    if isinstance(predictions, (tuple, list)):
        predictions = predictions[0]
    predictions = np.asarray(predictions)
    if predictions.ndim == 3:
        predictions = predictions.argmax(axis=-1)
    labels = np.asarray(eval_pred.label_ids)
    skip = {IGNORE_INDEX, 0}  # -100 padding, and [PAD] (also the decoder start token)
    hits = [
        _first_token(prediction, skip) == _first_token(label, skip)
        for prediction, label in zip(predictions, labels)
    ]
    return {"topic_accuracy": float(np.mean(hits)) if hits else 0.0}


def _first_token(row: np.ndarray, skip: set[int]) -> int:
    for token in row.tolist():
        if token not in skip:
            return int(token)
    return IGNORE_INDEX
