"""SFTTrainer from hf_lightning.trl against stock TRL: same tiny model, tokenizer, data and seed."""

from __future__ import annotations

import pytest

from tests.trl import harness, tiny

# name -> (dataset, SFTConfig fields beyond harness.BASE_FIELDS)
SCENARIOS = {
    # TRL's own defaults for precision and checkpointing: bf16 autocast, gradient checkpointing.
    "plain_text": (tiny.text_dataset, {"bf16": None, "gradient_checkpointing": True}),
    "conversational": (tiny.conversational_dataset, {}),
    "packing": (tiny.text_dataset, {"packing": True, "max_length": 16}),
    # A prompt-completion dataset trains on the completion only (TRL's default completion_only_loss).
    "completion_only": (tiny.prompt_completion_dataset, {}),
    "assistant_only": (tiny.conversational_dataset, {"assistant_only_loss": True}),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (ours, stock, folder): each scenario's pair of runs, made once for the module's tests."""
    made: dict = {}

    def get(name: str):
        if name not in made:
            dataset, fields = SCENARIOS[name]
            root = tmp_path_factory.mktemp(f"sft_{name}")
            stock = harness.run("stock", root / "stock", dataset(), **fields)
            ours = harness.run("ours", root / "ours", dataset(), **fields)
            made[name] = (ours, stock, root)
        return made[name]

    return get


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_sft_matches_stock_trl(runs, name):
    ours, stock, _ = runs(name)
    harness.assert_parity(ours, stock)
    keys = set(stock.log_history[0])
    assert {"loss", "grad_norm", "learning_rate", "entropy", "mean_token_accuracy", "num_tokens"} <= keys, name
    # The run went through Lightning's fit, and the trainer's model is the user's model.
    assert ours.trainer.lightning_trainer is not None
    assert type(ours.trainer.model).__name__ == "LlamaForCausalLM"


def test_sft_resume_is_exact(runs, tmp_path):
    ours, stock, root = runs("plain_text")
    fields = SCENARIOS["plain_text"][1]
    resumed = {
        side: harness.run(
            side, tmp_path / side, tiny.text_dataset(), resume_from_checkpoint=str(root / side / "checkpoint-2"),
            **fields,
        )
        for side in ("stock", "ours")
    }
    # The resumed run is stock TRL's resumed run (TRL's num_tokens restarts from 0 there: its token count is
    # not part of the checkpoint; train_loss covers the resumed steps, as in transformers).
    harness.assert_same_history(resumed["ours"].log_history, resumed["stock"].log_history)
    harness.assert_same_weights(resumed["ours"].weights, resumed["stock"].weights)
    # ... and it trains exactly as the uninterrupted run: the same losses after the checkpoint, the same weights.
    after = [(e["step"], e["loss"], e["grad_norm"]) for e in resumed["ours"].log_history if "loss" in e][2:]
    assert after == [(e["step"], e["loss"], e["grad_norm"]) for e in ours.log_history if "loss" in e][2:]
    harness.assert_same_weights(resumed["ours"].weights, ours.weights)


def test_classes_run_trls_own_code():
    import trl

    from hf_lightning import Trainer, TrainingArguments
    from hf_lightning.trl import SFTConfig, SFTTrainer

    assert issubclass(SFTTrainer, Trainer) and issubclass(SFTConfig, TrainingArguments)
    assert SFTTrainer.__name__ == "SFTTrainer" and SFTConfig.__name__ == "SFTConfig"
    # __init__ is TRL's behind the stock-config conversion (hf_lightning/trl/stock_configs.py).
    assert SFTTrainer.__init__.__wrapped__.__code__ is trl.SFTTrainer.__init__.__code__
    for method in ("compute_loss", "log", "training_step", "_save_checkpoint"):
        assert getattr(SFTTrainer, method).__code__ is getattr(trl.SFTTrainer, method).__code__, method
    trl_fields = [f.name for f in trl.SFTConfig.__dataclass_fields__.values()]
    assert set(SFTConfig.__dataclass_fields__) == set(trl_fields)
