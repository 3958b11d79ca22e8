"""`create_model_card`: the same README.md as the reference for the same run; a minimal card without transformers."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.models import classification_data, make_tiny_bert_classifier
from tests.no_transformers import BLOCK_TRANSFORMERS
from tests.parity.harness import run_parity

ROOT = Path(__file__).resolve().parents[2]


def _normalise(card: str) -> str:
    # Only the "Framework versions" lines may legitimately differ (same packages here, but the versions are
    # environment facts, not behaviour); the run folder name is "reference" vs "ours" by the harness's design.
    card = re.sub(r"^- (Transformers|Pytorch|Datasets|Tokenizers) .*$", r"- \1 <version>", card, flags=re.M)
    return re.sub(r"^(# |- name: )(reference|ours)$", r"\1<run>", card, flags=re.M)


def _run_and_card(tmp_path, second_card_tags=None, **card_kwargs) -> tuple[str, str]:
    def run(trainer):
        trainer.train()
        trainer.create_model_card(**card_kwargs)
        if second_card_tags is not None:  # a second card merges the first card's tags into the given ones
            trainer.create_model_card(tags=list(second_card_tags))

    result = run_parity(
        make_tiny_bert_classifier(),
        classification_data(n=8),
        tmp_path,
        run=run,
        trainer_kwargs={"eval_dataset": classification_data(n=4, seed=1)},
        max_steps=4,
        per_device_train_batch_size=2,
        eval_strategy="steps",
        eval_steps=2,
        logging_steps=1,
        gradient_accumulation_steps=2,
        warmup_steps=1,
    )
    ref = (Path(result.reference.trainer.args.output_dir) / "README.md").read_text(encoding="utf-8")
    ours = (Path(result.ours.trainer.args.output_dir) / "README.md").read_text(encoding="utf-8")
    return ref, ours


def test_model_card_equals_reference(tmp_path):
    ref, ours = _run_and_card(
        tmp_path, language="en", license="mit", tags="my-tag", finetuned_from="org/base", dataset="my-data"
    )
    assert "## Training results" in ref and "Validation Loss" in ref  # the eval table is really there
    assert _normalise(ours) == _normalise(ref)


def test_model_card_defaults_equal_reference_and_keep_existing_tags(tmp_path):
    ref, ours = _run_and_card(tmp_path, second_card_tags=["second"], tags=["first"])
    assert _normalise(ours) == _normalise(ref)
    assert "- second\n- first\n- generated_from_trainer\n" in ours


def test_model_card_only_on_world_process_zero(tmp_path, monkeypatch):
    from hf_lightning import TrainingArguments
    from hf_lightning.trainer.trainer import HFLightningTrainer

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    trainer = HFLightningTrainer(model=make_tiny_bert_classifier(), args=args)
    monkeypatch.setattr(trainer, "is_world_process_zero", lambda: False)
    trainer.create_model_card()
    assert not (tmp_path / "README.md").exists()


def test_minimal_model_card_without_transformers(tmp_path):
    script = BLOCK_TRANSFORMERS + textwrap.dedent(
        f"""
        import sys, torch
        sys.path.insert(0, {str(ROOT)!r})
        from tests.models import make_regression_mlp, regression_data
        from hf_lightning import TrainingArguments
        from hf_lightning.trainer.trainer import HFLightningTrainer

        args = TrainingArguments(output_dir={str(tmp_path / "run")!r}, use_cpu=True, report_to="none",
                                 max_steps=2, per_device_train_batch_size=2, learning_rate=0.25,
                                 disable_tqdm=True, eval_strategy="steps", eval_steps=2)
        data = regression_data(n=6)
        trainer = HFLightningTrainer(model=make_regression_mlp(), args=args, train_dataset=data, eval_dataset=data)
        trainer.train()
        trainer.create_model_card(license="mit", tags=["mine"])
        assert "transformers" not in sys.modules
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    card = (tmp_path / "run" / "README.md").read_text(encoding="utf-8")
    from huggingface_hub import ModelCard

    parsed = ModelCard(card)
    assert parsed.data.license == "mit"
    assert parsed.data.tags == ["mine", "generated_from_trainer"]
    assert "# run" in card
    assert "- learning_rate: 0.25" in card
    assert "- training_steps: 2" in card
    assert "'eval_loss':" in card and "'train_runtime':" in card
