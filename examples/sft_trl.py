"""TRL's SFTTrainer on hf_lightning's engine, moved by changing one import (needs `pip install -e ".[trl]"`).

Fine-tunes a tiny Llama (built from a config) on an embedded conversational data set with an in-process
word-level tokenizer and chat template; nothing is downloaded. The loss is on the assistant's turns only.
Run: `python examples/sft_trl.py --output_dir sft_out --max_steps 30`. Like the other examples it trains on one
CPU thread (`--num_threads`): the model is tiny, and more threads make a busy machine many times slower.
"""

from __future__ import annotations

import argparse

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

# from trl import SFTConfig, SFTTrainer
from hf_lightning.trl import SFTConfig, SFTTrainer

QA = [
    ("what color is the sky", "the sky is blue"), ("what color is the grass", "the grass is green"),
    ("one plus one", "two"), ("two plus three", "five"), ("hello", "hi how are you"),
    ("how are you", "fine thanks"), ("is the sun big", "yes"), ("is the moon big", "no the moon is small"),
    ("three plus four", "seven"), ("four plus five", "nine"), ("good day", "good day to you"), ("hi", "hello"),
]
# `{% generation %}` marks the assistant's tokens, which assistant_only_loss trains on.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}<|assistant|> {% generation %}{{ message['content'] }} <|end|>"
    "{% endgeneration %}{% else %}<|{{ message['role'] }}|> {{ message['content'] }} <|end|> {% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the data's words, with pad / eos tokens and the chat template."""
    special = ["<pad>", "<eos>", "<unk>", "<|user|>", "<|assistant|>", "<|end|>"]
    words = sorted({word for pair in QA for text in pair for word in text.split()})
    vocab = {token: index for index, token in enumerate(special + words)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--output_dir", default="sft_trl_output")
    parser.add_argument("--max_steps", type=int, default=30)
    parser.add_argument("--num_threads", type=int, default=1, help="torch CPU threads (default: 1)")
    cli = parser.parse_args()
    torch.set_num_threads(cli.num_threads)

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    ))
    dataset = Dataset.from_dict(
        {"messages": [[{"role": "user", "content": q}, {"role": "assistant", "content": a}] for q, a in QA]}
    )
    args = SFTConfig(
        output_dir=cli.output_dir, max_steps=cli.max_steps, per_device_train_batch_size=4, learning_rate=3e-3,
        logging_steps=10, save_strategy="no", report_to="none", use_cpu=True, bf16=False,
        activation_checkpointing=False, assistant_only_loss=True, max_length=32, disable_tqdm=True,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    print(trainer.train())
    trainer.save_model()
    print(f"saved to {cli.output_dir}")


if __name__ == "__main__":
    main()
