"""setfit end to end on hf_lightning: `on_lightning(setfit.Trainer)` rebuilds setfit's trainer, whose constructor
builds a sentence-transformers trainer (rebuilt over ours with it) and then rewrites about twenty of its arguments;
the embedding phase runs on Lightning and the classifier head is fitted as setfit does. Against stock setfit on the
same tiny model, data and seed: equal embedding-phase logs, body weights, head, predictions and metrics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tests.adapted import st_harness as st

TEXTS = ["I loved it", "great film", "what a joy", "wonderful day", "awful mess", "I hated it", "terrible plot",
         "so boring"]
LABELS = [1, 1, 1, 1, 0, 0, 0, 0]


def _accuracy(predictions, references) -> dict[str, float]:
    return {"accuracy": float(np.mean(np.asarray(predictions) == np.asarray(references)))}


def _run(side: str, model_dir: str, out: Path):
    import setfit
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sklearn.linear_model import LogisticRegression

    from hf_lightning import on_lightning

    trainer_cls = setfit.Trainer if side == "stock" else on_lightning(setfit.Trainer)
    torch.manual_seed(0)
    model = setfit.SetFitModel(
        model_body=SentenceTransformer(model_dir, device="cpu"), model_head=LogisticRegression(random_state=0)
    )
    args = setfit.TrainingArguments(
        output_dir=str(out), batch_size=4, num_epochs=1, num_iterations=2, seed=0, report_to="none",
        logging_steps=1, body_learning_rate=1e-3, use_amp=False,
    )
    data = Dataset.from_dict({"text": TEXTS, "label": LABELS})
    trainer = trainer_cls(model=model, args=args, train_dataset=data, eval_dataset=data, metric=_accuracy)
    trainer.train()
    return trainer, trainer.evaluate(), model.predict_proba(TEXTS)


def test_setfit_end_to_end_matches_stock(tmp_path, tiny_bert):
    stock, stock_metrics, stock_probabilities = _run("stock", tiny_bert, tmp_path / "stock")
    ours, our_metrics, our_probabilities = _run("ours", tiny_bert, tmp_path / "ours")
    assert type(ours.st_trainer).__module__ == "hf_lightning.adapted.setfit.trainer"
    assert ours.st_trainer.lightning_trainer is not None  # the embedding phase ran on Lightning's fit
    # setfit rewrote the learning rate, logging and run length after the trainer was built: both read them. The
    # batch size it rewrote too is the one the reference fixed in its constructor (`_train_batch_size`): 8 on both.
    assert ours.st_trainer.state.train_batch_size == stock.st_trainer.state.train_batch_size == 8
    assert ours.st_trainer.state.logging_steps == stock.st_trainer.state.logging_steps == 1
    assert st.history(ours.st_trainer) == st.history(stock.st_trainer)
    assert len(st.history(stock.st_trainer)) > 2
    st.assert_same_weights(st.weights(ours.model.model_body), st.weights(stock.model.model_body))
    assert np.array_equal(ours.model.model_head.coef_, stock.model.model_head.coef_)
    assert torch.equal(torch.as_tensor(our_probabilities), torch.as_tensor(stock_probabilities))
    assert our_metrics == stock_metrics
