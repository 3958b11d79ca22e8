"""sentence-transformers' trainers on hf_lightning (`hf_lightning.adapted.sentence_transformers`) against stock
sentence-transformers on transformers: same tiny model, data and seed; equal logs, evaluator scores, weights and
files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.adapted import st_harness as st

ROOT = Path(__file__).resolve().parents[2]
FIELDS = dict(
    use_cpu=True, report_to="none", per_device_train_batch_size=4, learning_rate=1e-3, logging_steps=1, seed=0,
    disable_tqdm=True,
)


def _bi_encoder(side: str, model_dir: str, out: Path, max_steps: int = 6, resume: str | None = None, **fields):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    trainer_cls, args_cls = st.classes(side, "SentenceTransformerTrainer", "SentenceTransformerTrainingArguments")
    evaluation = st.pairs(6)
    evaluator = EmbeddingSimilarityEvaluator(
        evaluation["sentence1"], evaluation["sentence2"], evaluation["score"], name="dev"
    )
    args = args_cls(
        output_dir=str(out), max_steps=max_steps, eval_strategy="steps", eval_steps=2, save_steps=2,
        **{**FIELDS, **fields},
    )
    trainer = trainer_cls(
        model=SentenceTransformer(model_dir, device="cpu"), args=args, train_dataset=st.pairs(),
        eval_dataset=evaluation, evaluator=evaluator,
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_bi_encoder_with_an_evaluator_and_checkpoints_matches_stock(tmp_path, tiny_bert):
    stock = _bi_encoder("stock", tiny_bert, tmp_path / "stock")
    ours = _bi_encoder("ours", tiny_bert, tmp_path / "ours")
    assert type(ours).__module__ == "hf_lightning.adapted.sentence_transformers.sentence_transformer.trainer"
    assert st.history(ours) == st.history(stock)
    assert {"eval_dev_pearson_cosine", "eval_dev_spearman_cosine", "eval_loss"} <= set(st.history(stock)[2])
    st.assert_same_weights(st.weights(ours.model), st.weights(stock.model))
    st.assert_same_files(tmp_path / "ours", tmp_path / "stock")
    assert sorted(p.name for p in (tmp_path / "ours").glob("checkpoint-*")) == [
        "checkpoint-2", "checkpoint-4", "checkpoint-6"
    ]


def test_training_args_bin_loads_in_a_new_process(tmp_path, tiny_bert):
    """A rebuilt arguments class lives in an importable module: a fresh interpreter unpickles it by name."""
    _bi_encoder("ours", tiny_bert, tmp_path / "ours", max_steps=2)
    _bi_encoder("stock", tiny_bert, tmp_path / "stock", max_steps=2)
    code = (
        "import sys, torch\n"
        "ours = torch.load(sys.argv[1], weights_only=False)\n"
        "stock = torch.load(sys.argv[2], weights_only=False)\n"
        "print(type(ours).__module__, type(ours).__name__)\n"
        "a, b = ours.to_dict(), stock.to_dict()\n"
        "print(sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "ours/checkpoint-2/training_args.bin"),
         str(tmp_path / "stock/checkpoint-2/training_args.bin")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    module_and_name, differing = completed.stdout.strip().splitlines()[-2:]
    assert module_and_name == (
        "hf_lightning.adapted.sentence_transformers.sentence_transformer.training_args "
        "SentenceTransformerTrainingArguments"
    )
    # Only the output folder differs (by name); every other field serialises equal to the reference's.
    assert differing == "['output_dir']"


@pytest.mark.slow
def test_resume_mid_epoch_equals_the_uninterrupted_stock_run(tmp_path, tiny_bert):
    """Resumed from checkpoint-2 (half-way through the first epoch, through sentence-transformers'
    `_load_from_checkpoint`), ours ends bit-exact with stock's run that was never interrupted."""
    stock = _bi_encoder("stock", tiny_bert, tmp_path / "stock")
    _bi_encoder("ours", tiny_bert, tmp_path / "ours", max_steps=6)
    resumed = _bi_encoder("ours", tiny_bert, tmp_path / "ours", resume=str(tmp_path / "ours" / "checkpoint-2"))
    assert resumed.state.global_step == 6
    # Every step's entry equals the uninterrupted run's; the closing summary's train_loss averages only the steps
    # this call trained, in both libraries, so it is compared with stock's own resume from its checkpoint-2.
    assert st.history(resumed)[:-1] == st.history(stock)[:-1]
    st.assert_same_weights(st.weights(resumed.model), st.weights(stock.model))
    stock_resumed = _bi_encoder(
        "stock", tiny_bert, tmp_path / "stock", resume=str(tmp_path / "stock" / "checkpoint-2")
    )
    assert st.history(resumed)[-1] == st.history(stock_resumed)[-1]
    st.assert_same_weights(st.weights(stock_resumed.model), st.weights(stock.model))


def _cross_encoder(side: str, model_dir: str, out: Path):
    from datasets import Dataset
    from sentence_transformers.cross_encoder import CrossEncoder
    from sentence_transformers.cross_encoder.evaluation import CrossEncoderCorrelationEvaluator

    trainer_cls, args_cls = st.classes(side, "CrossEncoderTrainer", "CrossEncoderTrainingArguments")
    torch.manual_seed(0)  # the classification head is initialised here
    model = CrossEncoder(model_dir, num_labels=1, device="cpu")
    train = Dataset.from_dict({"sentence1": st.SENTENCES_1, "sentence2": st.SENTENCES_2, "label": st.SCORES})
    evaluation = train.select(range(6))
    evaluator = CrossEncoderCorrelationEvaluator(
        list(zip(evaluation["sentence1"], evaluation["sentence2"])), evaluation["label"], name="dev"
    )
    args = args_cls(
        output_dir=str(out), max_steps=6, eval_strategy="steps", eval_steps=2, save_steps=2,
        load_best_model_at_end=True, metric_for_best_model="eval_dev_spearman", save_total_limit=2, **FIELDS,
    )
    trainer = trainer_cls(model=model, args=args, train_dataset=train, eval_dataset=evaluation, evaluator=evaluator)
    trainer.train()
    return trainer


def test_cross_encoder_loads_the_best_model_at_end_as_stock(tmp_path, tiny_bert):
    stock = _cross_encoder("stock", tiny_bert, tmp_path / "stock")
    ours = _cross_encoder("ours", tiny_bert, tmp_path / "ours")
    assert st.history(ours) == st.history(stock)
    assert ours.state.best_model_checkpoint.replace(str(tmp_path / "ours"), "") == (
        stock.state.best_model_checkpoint.replace(str(tmp_path / "stock"), "")
    )
    assert ours.state.best_metric == stock.state.best_metric
    assert ours.state.best_model_checkpoint.endswith("checkpoint-4")  # not the last: loading it changes the weights
    st.assert_same_weights(st.weights(ours.model), st.weights(stock.model))
    st.assert_same_files(tmp_path / "ours", tmp_path / "stock")
