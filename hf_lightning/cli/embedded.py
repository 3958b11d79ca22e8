"""The embedded default task: data, tokenizer and tiny transformer for `hf-lightning`'s main job.

Everything is generated in-process from a seed (nothing is downloaded and transformers is not
needed), so a new user sees a real training run, with a metric well above chance, in under a minute
on a laptop CPU.

The task ("main topic"): each sentence mixes filler words with words of its topic and, fewer of
them, words of one other topic; the label is the topic with the most words. Four classes, chance
25%. It is deliberately easy (a tiny transformer passes 90% in a few hundred steps): the
main job is a smoke test that proves the whole training stack works, not a benchmark. A negation
variant that bags of words cannot solve was tried and rejected: a tiny transformer learns it in
some seeds and not others within the time budget, and the first run must succeed for every seed.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

TOPICS: tuple[str, ...] = ("sports", "cooking", "weather", "technology")
NUM_LABELS = len(TOPICS)
CHANCE_ACCURACY = 1.0 / NUM_LABELS

TOPIC_WORDS: dict[str, tuple[str, ...]] = {
    "sports": (
        "football", "goal", "team", "coach", "match", "score", "player", "stadium",
        "referee", "league", "tennis", "season", "striker", "tournament", "medal", "race",
    ),
    "cooking": (
        "recipe", "oven", "garlic", "pasta", "kitchen", "sauce", "butter", "bake",
        "flour", "onion", "soup", "chef", "salt", "pepper", "dinner", "spoon",
    ),
    "weather": (
        "rain", "cloud", "storm", "sunny", "wind", "forecast", "snow", "thunder",
        "humid", "frost", "fog", "temperature", "umbrella", "breeze", "drizzle", "heatwave",
    ),
    "technology": (
        "laptop", "software", "server", "code", "network", "robot", "chip", "battery",
        "app", "keyboard", "database", "algorithm", "screen", "wifi", "update", "browser",
    ),
}  # fmt: skip

FILLER_WORDS: tuple[str, ...] = (
    "the", "a", "this", "that", "was", "is", "very", "really", "and", "but", "we", "they",
    "i", "it", "today", "yesterday", "about", "with", "of", "on", "in", "so", "quite",
    "new", "old", "big", "small", "after", "before", "our", "my", "their", "talked",
    "saw", "liked", "read", "heard", "again", "all", "some",
)  # fmt: skip

PAD_TOKEN, UNK_TOKEN, CLS_TOKEN = "[PAD]", "[UNK]", "[CLS]"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, UNK_TOKEN, CLS_TOKEN)  # ids 0, 1, 2

DEFAULT_TRAIN_SIZE = 4000
DEFAULT_EVAL_SIZE = 400
MAX_LENGTH = 32  # longest generated sentence is 15 words + [CLS]; the rest is room for user text

CONFIG_NAME = "config.json"
VOCAB_NAME = "vocab.json"


# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------


def generate_examples(num_examples: int, seed: int, split: str) -> list[dict[str, Any]]:
    """Generate `num_examples` labelled sentences `{"text", "label"}`; the same seed and split give the same list.

    Each split draws from its own stream (seeded by the string `"{seed}-{split}"`, which Python
    hashes deterministically), so the eval split does not change when the train size does.
    """
    if num_examples < 0:
        raise ValueError(f"num_examples={num_examples} must be >= 0.")
    rng = random.Random(f"{seed}-{split}")
    examples = []
    for _ in range(num_examples):
        label = rng.randrange(NUM_LABELS)
        other = rng.choice([index for index in range(NUM_LABELS) if index != label])
        topic_count = rng.randint(2, 4)
        other_count = rng.randint(0, topic_count - 1)  # strictly fewer, so the label is never a tie
        words = rng.sample(TOPIC_WORDS[TOPICS[label]], topic_count)
        words += rng.sample(TOPIC_WORDS[TOPICS[other]], other_count)
        words += [rng.choice(FILLER_WORDS) for _ in range(rng.randint(3, 8))]
        rng.shuffle(words)
        examples.append({"text": " ".join(words), "label": label})
    return examples


class EmbeddedDataset(Dataset):
    """A plain torch Dataset of `{"input_ids": list[int], "labels": int}` items (padding is the collator's job)."""

    def __init__(self, examples: Sequence[dict[str, Any]], tokenizer: EmbeddedTokenizer) -> None:
        self.texts = [example["text"] for example in examples]
        self.labels = [int(example["label"]) for example in examples]
        self.input_ids = [tokenizer.encode(text)["input_ids"] for text in self.texts]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"input_ids": list(self.input_ids[index]), "labels": self.labels[index]}


# ----------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------


class EmbeddedTokenizer:
    """Word-level tokenizer built in-process from training text: `[PAD]`=0, `[UNK]`=1, `[CLS]`=2, then words.

    Splits on whitespace after lower-casing. Mirrors the small part of a Hugging Face tokenizer that
    a Trainer touches: `__call__`, `pad`, `pad_token_id`, `model_input_names`, `save_pretrained`.
    """

    model_input_names: list[str] = ["input_ids", "attention_mask"]
    padding_side = "right"

    def __init__(self, vocab: dict[str, int], model_max_length: int = MAX_LENGTH) -> None:
        for position, token in enumerate(SPECIAL_TOKENS):
            if vocab.get(token) != position:
                raise ValueError(f"vocab[{token!r}] must be {position}; got {vocab.get(token)!r}.")
        self.vocab = dict(vocab)
        self.ids_to_tokens = {index: token for token, index in self.vocab.items()}
        self.model_max_length = model_max_length
        self.pad_token, self.unk_token, self.cls_token = SPECIAL_TOKENS
        self.pad_token_id, self.unk_token_id, self.cls_token_id = 0, 1, 2

    @classmethod
    def train(cls, texts: Sequence[str], model_max_length: int = MAX_LENGTH) -> EmbeddedTokenizer:
        """Build the vocabulary from `texts`: most frequent words first, ties alphabetical (deterministic)."""
        counts = Counter(word for text in texts for word in text.lower().split())
        words = sorted((word for word in counts if word not in SPECIAL_TOKENS), key=lambda w: (-counts[w], w))
        vocab = {token: index for index, token in enumerate([*SPECIAL_TOKENS, *words])}
        return cls(vocab, model_max_length=model_max_length)

    def __len__(self) -> int:
        return len(self.vocab)

    @property
    def vocab_size(self) -> int:
        """Number of tokens, special tokens included (the embedding table's size)."""
        return len(self.vocab)

    def encode(
        self, text: str, truncation: bool = True, max_length: int | None = None
    ) -> dict[str, list[int]]:
        """Tokenize one text: `[CLS]` then one id per word; returns `input_ids` and `attention_mask`."""
        ids = [self.cls_token_id] + [self.vocab.get(word, self.unk_token_id) for word in text.lower().split()]
        limit = max_length if max_length is not None else self.model_max_length
        if truncation and len(ids) > limit:
            ids = ids[:limit]
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}

    def __call__(
        self, text: str | Sequence[str], truncation: bool = True, max_length: int | None = None
    ) -> dict[str, Any]:
        """Tokenize one text or a list of texts (unpadded lists, as a Hugging Face tokenizer returns them)."""
        if isinstance(text, str):
            return self.encode(text, truncation=truncation, max_length=max_length)
        encoded = [self.encode(one, truncation=truncation, max_length=max_length) for one in text]
        return {key: [one[key] for one in encoded] for key in ("input_ids", "attention_mask")}

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Turn ids back into a space-separated string (special tokens dropped by default)."""
        ids = [int(index) for index in ids]
        special_ids = (
            {self.pad_token_id, self.unk_token_id, self.cls_token_id} if skip_special_tokens else set()
        )
        return " ".join(self.ids_to_tokens[index] for index in ids if index not in special_ids)

    def pad(
        self,
        features: Sequence[dict[str, Any]],
        padding: bool | str = True,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        return_tensors: str | None = "pt",
    ) -> dict[str, Any]:
        """Pad `input_ids` (and `attention_mask`) of `features` on the right; other keys are stacked.

        The signature is the one `DataCollatorWithPadding` calls, so this tokenizer also works there.
        """
        if padding not in (True, "longest", "max_length"):
            raise ValueError(f"padding={padding!r} is not supported; use True, 'longest' or 'max_length'.")
        if return_tensors not in ("pt", None):
            raise ValueError(f"return_tensors={return_tensors!r} is not supported; use 'pt'.")
        if padding == "max_length" and max_length is None:
            raise ValueError("padding='max_length' needs max_length; pass max_length=N.")
        lengths = [len(feature["input_ids"]) for feature in features]
        target = max_length if padding == "max_length" else max(lengths, default=0)
        if pad_to_multiple_of:
            target = math.ceil(target / pad_to_multiple_of) * pad_to_multiple_of
        batch: dict[str, Any] = {"input_ids": [], "attention_mask": []}
        for feature, length in zip(features, lengths):
            mask = list(feature.get("attention_mask", [1] * length))
            batch["input_ids"].append(list(feature["input_ids"]) + [self.pad_token_id] * (target - length))
            batch["attention_mask"].append(mask + [0] * (target - length))
        for key in features[0] if features else ():
            if key not in batch:
                batch[key] = [feature[key] for feature in features]
        if return_tensors == "pt":
            batch = {key: torch.tensor(value) for key, value in batch.items()}
        return batch

    def save_pretrained(self, save_directory: str | Path) -> list[str]:
        """Write the vocabulary as `vocab.json` ({token: id}) in `save_directory`; returns the written paths."""
        path = Path(save_directory) / VOCAB_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.vocab, indent=0, ensure_ascii=False) + "\n", encoding="utf-8")
        return [str(path)]

    @classmethod
    def from_pretrained(cls, directory: str | Path, model_max_length: int = MAX_LENGTH) -> EmbeddedTokenizer:
        """Load a tokenizer written by `save_pretrained`."""
        vocab = json.loads((Path(directory) / VOCAB_NAME).read_text(encoding="utf-8"))
        return cls(vocab, model_max_length=model_max_length)


class EmbeddedCollator:
    """Pads a list of `{"input_ids", "labels"}` items to the longest in the batch.

    Returns `{"input_ids", "attention_mask", "labels"}` tensors (0 marks padding in the mask).
    """

    def __init__(self, pad_token_id: int = 0) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        longest = max(len(feature["input_ids"]) for feature in features)
        input_ids = torch.full((len(features), longest), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(features), longest), dtype=torch.long)
        for row, feature in enumerate(features):
            length = len(feature["input_ids"])
            input_ids[row, :length] = torch.as_tensor(feature["input_ids"], dtype=torch.long)
            attention_mask[row, :length] = 1
        labels = torch.tensor([int(feature["labels"]) for feature in features], dtype=torch.long)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


# ----------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------


class TinyTransformerClassifier(nn.Module):
    """A 2-layer transformer encoder with masked mean pooling and a linear head; a plain `nn.Module`.

    `forward` returns `{"loss", "logits"}` like a Hugging Face model, so any Trainer can drive it.
    Its settings live in the plain dict `model_config` (not `config`: `transformers.Trainer` writes
    `model.config.use_cache` when a model has a `config` attribute).
    """

    def __init__(
        self,
        vocab_size: int,
        num_labels: int = NUM_LABELS,
        d_model: int = 64,
        num_heads: int = 4,
        num_layers: int = 2,
        dim_feedforward: int = 128,
        dropout: float = 0.1,
        max_position_embeddings: int = MAX_LENGTH,
        pad_token_id: int = 0,
    ) -> None:
        super().__init__()
        self.model_config: dict[str, Any] = {
            "vocab_size": vocab_size,
            "num_labels": num_labels,
            "d_model": d_model,
            "num_heads": num_heads,
            "num_layers": num_layers,
            "dim_feedforward": dim_feedforward,
            "dropout": dropout,
            "max_position_embeddings": max_position_embeddings,
            "pad_token_id": pad_token_id,
        }
        self.token_embeddings = nn.Embedding(vocab_size, d_model, padding_idx=pad_token_id)
        self.position_embeddings = nn.Embedding(max_position_embeddings, d_model)
        self.embedding_dropout = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(
            d_model, num_heads, dim_feedforward, dropout, batch_first=True, norm_first=True
        )
        # Nested tensors are off so training and eval take the same code path (and no warning is printed).
        self.encoder = nn.TransformerEncoder(
            layer, num_layers, norm=nn.LayerNorm(d_model), enable_nested_tensor=False
        )
        self.classifier = nn.Linear(d_model, num_labels)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Classify a padded batch; `loss` (cross-entropy) is present only when `labels` are given."""
        if input_ids.shape[1] > self.model_config["max_position_embeddings"]:
            raise ValueError(
                f"input_ids has {input_ids.shape[1]} positions but max_position_embeddings="
                f"{self.model_config['max_position_embeddings']}; truncate the inputs (tokenizer max_length)."
            )
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        hidden = self.token_embeddings(input_ids) + self.position_embeddings(positions)
        hidden = self.embedding_dropout(hidden)
        hidden = self.encoder(hidden, src_key_padding_mask=attention_mask == 0)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        logits = self.classifier(pooled)
        if labels is None:
            return {"logits": logits}
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}

    def save_config(self, save_directory: str | Path) -> str:
        """Write `model_config` (plus the topic names) as `config.json`; returns the path."""
        path = Path(save_directory) / CONFIG_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        config = {**self.model_config, "id2label": dict(enumerate(TOPICS))}
        path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        return str(path)

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> TinyTransformerClassifier:
        """Rebuild the model from `config.json` and load `model.safetensors` from `directory`."""
        from safetensors.torch import load_file

        config = json.loads((Path(directory) / CONFIG_NAME).read_text(encoding="utf-8"))
        config.pop("id2label", None)
        model = cls(**config)
        model.load_state_dict(load_file(str(Path(directory) / "model.safetensors")))
        return model


# ----------------------------------------------------------------------------------------------
# Metric and the run
# ----------------------------------------------------------------------------------------------


def accuracy_metric(eval_pred: Any) -> dict[str, float]:
    """`compute_metrics` for the task: fraction of argmax(predictions) equal to `label_ids`."""
    predictions = eval_pred.predictions
    if isinstance(predictions, (tuple, list)):
        predictions = predictions[0]  # a model returning extra outputs puts logits first
    predicted = np.asarray(predictions).argmax(axis=-1)
    return {"accuracy": float((predicted == np.asarray(eval_pred.label_ids)).mean())}


def default_training_args(output_dir: str | Path, seed: int) -> dict[str, Any]:
    """The TrainingArguments kwargs of the main job, tuned to reach >= 90% eval accuracy in well under a minute on 2 CPU cores."""
    return {
        "output_dir": str(output_dir),
        "seed": seed,
        "learning_rate": 2e-3,
        "weight_decay": 0.01,
        "warmup_steps": 0.1,  # a float below 1 is a ratio of the total steps (v5 semantics)
        "num_train_epochs": 3,
        "per_device_train_batch_size": 32,
        "per_device_eval_batch_size": 128,
        "logging_steps": 25,
        "eval_strategy": "epoch",
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "dataloader_num_workers": 0,
    }


def build_embedded_run(
    output_dir: str | Path,
    seed: int = 42,
    *,
    train_size: int = DEFAULT_TRAIN_SIZE,
    eval_size: int = DEFAULT_EVAL_SIZE,
    **overrides: Any,
) -> dict[str, Any]:
    """Build everything the main job needs: model, datasets, collator, tokenizer, metric and TrainingArguments kwargs.

    `overrides` replace entries of the TrainingArguments kwargs (e.g. `num_train_epochs=1`,
    `max_steps=50`). The model is initialised under `torch.manual_seed(seed)`, so a seed fixes the run.
    """
    train_examples = generate_examples(train_size, seed, "train")
    eval_examples = generate_examples(eval_size, seed, "eval")
    tokenizer = EmbeddedTokenizer.train([example["text"] for example in train_examples])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyTransformerClassifier(
            vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id
        )
    return {
        "model": model,
        "train_dataset": EmbeddedDataset(train_examples, tokenizer),
        "eval_dataset": EmbeddedDataset(eval_examples, tokenizer),
        "data_collator": EmbeddedCollator(pad_token_id=tokenizer.pad_token_id),
        "tokenizer": tokenizer,
        "compute_metrics": accuracy_metric,
        "training_args": {**default_training_args(output_dir, seed), **overrides},
    }
