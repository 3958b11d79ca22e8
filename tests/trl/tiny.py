"""A tiny causal LM (from a config), a word-level tokenizer with a chat template (built in-process) and data."""

from __future__ import annotations

import torch

WORDS = (
    "the a cat dog sat ran on mat log sun moon is red blue big small what color sky grass hello hi how are you "
    "fine thanks good day night yes no one two three four five six seven eight nine ten plus equals"
).split()
SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
# `{% generation %}` marks the assistant's tokens, which `assistant_only_loss` trains on.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}<|assistant|> {% generation %}{{ message['content'] }} <|end|>"
    "{% endgeneration %}{% else %}<|{{ message['role'] }}|> {{ message['content'] }} <|end|> {% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def make_tokenizer():
    """A `PreTrainedTokenizerFast` over a word-level vocabulary, with eos / pad tokens and a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIAL + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_model(seed: int = 0):
    """A 2-layer Llama with 32-wide hidden states over the tokenizer's vocabulary, seeded."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(SPECIAL) + len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0,
        eos_token_id=1, bos_token_id=2, tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def make_reward_model(seed: int = 0):
    """The same tiny Llama with a one-score sequence-classification head, seeded."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(SPECIAL) + len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0,
        eos_token_id=1, bos_token_id=2, num_labels=1,
    )
    return LlamaForSequenceClassification(config)


_SENTENCES = [
    "the cat sat on the mat", "the dog ran on the log", "the sun is big", "the moon is small",
    "what color is the sky", "the grass is blue", "one plus two equals three", "two plus two equals four",
    "hello how are you", "fine thanks good day", "the big dog sat", "the small cat ran",
]
_QA = [
    ("what color is the sky", "the sky is blue"), ("what color is the grass", "the grass is red"),
    ("one plus one", "two"), ("two plus three", "five"), ("hello", "hi how are you"),
    ("how are you", "fine thanks"), ("is the sun big", "yes"), ("is the moon big", "no the moon is small"),
    ("three plus four", "seven"), ("four plus five", "nine"), ("good day", "good day"), ("hi", "hello"),
]


def text_dataset():
    """Plain-text SFT data (a `text` column)."""
    from datasets import Dataset

    return Dataset.from_dict({"text": list(_SENTENCES)})


def conversational_dataset():
    """Conversational SFT data (a `messages` column of user / assistant turns)."""
    from datasets import Dataset

    return Dataset.from_dict(
        {"messages": [[{"role": "user", "content": q}, {"role": "assistant", "content": a}] for q, a in _QA]}
    )


def prompt_completion_dataset():
    """Prompt-completion SFT data (its loss is on the completion only, TRL's default)."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [q for q, _ in _QA], "completion": [" " + a for _, a in _QA]})


def preference_dataset():
    """Preference data (prompt / chosen / rejected), for DPO and reward modelling."""
    from datasets import Dataset

    rejected = [a for _, a in _QA[1:]] + [_QA[0][1]]
    return Dataset.from_dict(
        {"prompt": [q for q, _ in _QA], "chosen": [" " + a for _, a in _QA], "rejected": [" " + r for r in rejected]}
    )


def saved_model_dir(folder) -> str:
    """The seeded tiny model saved to `folder` (a model loaded from there knows its path, which DPO's implicit
    reference model is loaded from)."""
    make_model().save_pretrained(folder)
    return str(folder)


def load_model(folder: str):
    """The causal LM saved in `folder`."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder)
