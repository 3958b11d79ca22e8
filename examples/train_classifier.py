"""A Hugging Face-style training script, moved to hf_lightning by changing one import.

It trains the tiny transformer of hf_lightning's embedded task (generated data, in-process tokenizer,
nothing downloaded). Run: `python examples/train_classifier.py --output_dir out --max_steps 60`.

The model is tiny, so the script trains on one CPU thread (`--num_threads`, as `hf-lightning` does): with
torch's default of one thread per core, a busy machine runs it many times slower.

The model is a plain `nn.Module`, so `save_model` writes only its weights (`model.safetensors`) and the
tokenizer, as transformers.Trainer does for such a model; the script adds the model's `config.json`, and
`TinyTransformerClassifier.from_pretrained(output_dir)` / `EmbeddedTokenizer.from_pretrained(output_dir)`
reload both.
"""

from __future__ import annotations

import argparse

import torch

# from transformers import Trainer, TrainingArguments
from hf_lightning import Trainer, TrainingArguments
from hf_lightning.cli.embedded import build_embedded_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--output_dir", default="example_output")
    parser.add_argument("--max_steps", type=int, default=-1)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--num_threads", type=int, default=1, help="torch CPU threads (default: 1)")
    cli = parser.parse_args()
    torch.set_num_threads(cli.num_threads)  # a tiny model: more threads only add synchronisation

    run = build_embedded_run(cli.output_dir, seed=cli.seed)
    args = TrainingArguments(**{**run["training_args"], "max_steps": cli.max_steps})
    trainer = Trainer(
        model=run["model"],
        args=args,
        data_collator=run["data_collator"],
        train_dataset=run["train_dataset"],
        eval_dataset=run["eval_dataset"],
        processing_class=run["tokenizer"],
        compute_metrics=run["compute_metrics"],
    )
    print(trainer.train())
    print(trainer.evaluate())
    trainer.save_model(cli.output_dir)
    run["model"].save_config(cli.output_dir)  # a plain nn.Module has no config for save_model to write
    print(
        "reload with: from hf_lightning.cli.embedded import EmbeddedTokenizer, TinyTransformerClassifier\n"
        f"             TinyTransformerClassifier.from_pretrained({cli.output_dir!r})\n"
        f"             EmbeddedTokenizer.from_pretrained({cli.output_dir!r})"
    )


if __name__ == "__main__":
    main()
