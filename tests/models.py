"""Tiny seeded models and data sets shared by the tests (dropout 0 unless named, CPU, seconds each)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset


class RegressionMLP(nn.Module):
    """A 2-layer MLP returning {"loss", "logits"}; its forward has no **kwargs (loss divided by GA)."""

    def __init__(self, in_features: int = 4, hidden: int = 8):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.norm = nn.LayerNorm(in_features)

    def forward(self, x, labels=None):
        logits = self.net(self.norm(x)).squeeze(-1)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.mse_loss(logits, labels)
        return out


class LinearRegressor(nn.Module):
    """One linear layer returning `{"loss", "logits"}` like a Hugging Face model (`{"logits"}` without labels);
    seeded when `seed` is given."""

    def __init__(self, in_features: int = 4, seed: int | None = None):
        super().__init__()
        if seed is not None:
            torch.manual_seed(seed)
        self.linear = nn.Linear(in_features, 1)

    def forward(self, x, labels=None):
        logits = self.linear(x).squeeze(-1)
        if labels is None:
            return {"logits": logits}
        return {"loss": nn.functional.mse_loss(logits, labels), "logits": logits}


class DropoutMLP(nn.Module):
    """A seeded MLP with dropout, so a resume must restore the RNG; a plain module trains in well under a second."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Dropout(0.2), nn.Linear(16, 1))

    def forward(self, x, labels=None):
        logits = self.net(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(logits, labels), "logits": logits}


class ListDataset(Dataset):
    """A list of dict items (the reference's default collator stacks them)."""

    def __init__(self, items: list[dict]):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict:
        return self.items[index]


def regression_data(n: int = 10, in_features: int = 4, seed: int = 0) -> ListDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_features, generator=generator)
    y = x.sum(-1) * 0.5 + 0.1 * torch.randn(n, generator=generator)
    return ListDataset([{"x": x[i], "labels": y[i]} for i in range(n)])


def make_regression_mlp(seed: int = 0) -> RegressionMLP:
    torch.manual_seed(seed)
    return RegressionMLP()


def tiny_bert_config(num_hidden_layers: int = 2, num_labels: int = 2):
    """The tiny BERT every BERT model of the tests shares: vocabulary 64, width 16, no dropout."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=num_labels,
    )


def make_tiny_bert_classifier(seed: int = 0, num_labels: int = 2):
    from transformers import BertForSequenceClassification

    torch.manual_seed(seed)
    return BertForSequenceClassification(tiny_bert_config(2, num_labels))


def classification_data(n: int = 12, seq_len: int = 8, seed: int = 0, vocab: int = 64) -> ListDataset:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (n, seq_len), generator=generator)
    labels = torch.randint(0, 2, (n,), generator=generator)
    return ListDataset(
        [{"input_ids": ids[i], "attention_mask": torch.ones(seq_len, dtype=torch.long), "labels": labels[i]} for i in range(n)]
    )


def make_tiny_gpt2(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=64,
        n_positions=32,
        n_embd=16,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        pad_token_id=0,
    )
    return GPT2LMHeadModel(config)


def padded_lm_data(n: int = 12, max_len: int = 10, seed: int = 0, vocab: int = 64) -> ListDataset:
    """Right-padded causal-LM items of varying length: padding is 0 in input_ids and -100 in labels."""
    generator = torch.Generator().manual_seed(seed)
    items = []
    for _ in range(n):
        length = int(torch.randint(3, max_len + 1, (1,), generator=generator))
        ids = torch.zeros(max_len, dtype=torch.long)
        ids[:length] = torch.randint(1, vocab, (length,), generator=generator)
        mask = (torch.arange(max_len) < length).long()
        labels = ids.clone()
        labels[length:] = -100
        items.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return ListDataset(items)


def make_tiny_bert_token_classifier(seed: int = 0, num_labels: int = 3):
    from transformers import BertForTokenClassification

    torch.manual_seed(seed)
    return BertForTokenClassification(tiny_bert_config(1, num_labels))


def token_classification_data(
    lengths: tuple[int, ...] = (3, 5, 7, 4, 2, 6, 3), seed: int = 0, vocab: int = 64, num_labels: int = 3
) -> ListDataset:
    """Unpadded token-classification items of the given lengths (`pad_token_batch` pads them per batch)."""
    generator = torch.Generator().manual_seed(seed)
    return ListDataset(
        [
            {
                "input_ids": torch.randint(1, vocab, (n,), generator=generator),
                "labels": torch.randint(0, num_labels, (n,), generator=generator),
            }
            for n in lengths
        ]
    )


def pad_token_batch(features: list[dict]) -> dict[str, torch.Tensor]:
    """Pad a batch to its longest item: `input_ids` with 0, `attention_mask` with 0, `labels` with -100."""
    width = max(len(f["input_ids"]) for f in features)
    batch = {
        "input_ids": torch.zeros(len(features), width, dtype=torch.long),
        "attention_mask": torch.zeros(len(features), width, dtype=torch.long),
        "labels": torch.full((len(features), width), -100, dtype=torch.long),
    }
    for row, feature in enumerate(features):
        n = len(feature["input_ids"])
        batch["input_ids"][row, :n] = feature["input_ids"]
        batch["attention_mask"][row, :n] = 1
        batch["labels"][row, :n] = feature["labels"]
    return batch


def make_tiny_t5(seed: int = 0):
    """A tiny T5 (built offline from a config): pad 0, EOS 1, decoder start 0; dropout 0."""
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    config = T5Config(
        vocab_size=40,
        d_model=16,
        d_kv=8,
        d_ff=32,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        dropout_rate=0.0,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    return T5ForConditionalGeneration(config)


def seq2seq_data(n: int = 5, seed: int = 0, vocab: int = 40) -> ListDataset:
    """Source / target pairs of varying lengths (ids 2..vocab-1: 0 is pad, 1 is EOS)."""
    generator = torch.Generator().manual_seed(seed)
    items = []
    for i in range(n):
        source = torch.randint(2, vocab, (3 + i % 3,), generator=generator)
        target = torch.randint(2, vocab, (2 + i % 2,), generator=generator)
        items.append({"input_ids": source, "labels": target})
    return ListDataset(items)


def pad_seq2seq_batch(features: list[dict]) -> dict[str, torch.Tensor]:
    """Pad sources with 0 (attention mask 0) and targets with -100, each to the batch's longest."""
    width = max(len(f["input_ids"]) for f in features)
    label_width = max(len(f["labels"]) for f in features)
    batch = {
        "input_ids": torch.zeros(len(features), width, dtype=torch.long),
        "attention_mask": torch.zeros(len(features), width, dtype=torch.long),
        "labels": torch.full((len(features), label_width), -100, dtype=torch.long),
    }
    for row, feature in enumerate(features):
        n, m = len(feature["input_ids"]), len(feature["labels"])
        batch["input_ids"][row, :n] = feature["input_ids"]
        batch["attention_mask"][row, :n] = 1
        batch["labels"][row, :m] = feature["labels"]
    return batch


def make_tiny_llama(seed: int = 0, tied: bool = False, dropout: float = 0.0, vocab: int = 64):
    """A two-layer Llama (transformers defines its tensor-parallel plan, `base_model_tp_plan`); `dropout` is its
    attention dropout."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=tied,
        attention_dropout=dropout,
    )
    return LlamaForCausalLM(config)
