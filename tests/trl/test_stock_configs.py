"""A stock TRL config (or a transformers TrainingArguments, where TRL converts one) given to hf_lightning.trl's
trainers trains as the same values in our config do."""

from __future__ import annotations

import dataclasses
import warnings
from enum import Enum

import pytest

from tests.trl import harness, tiny
from tests.trl.test_grpo_parity import reward_length


def _grpo_data():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [q for q, _ in tiny._QA]})


def _saved_model(folder):
    """The tiny model loaded from a folder (DPO loads its implicit reference model from the policy's path)."""
    return tiny.load_model(tiny.saved_model_dir(folder))


# name -> (trainer, config, side the config comes from, dataset, model factory (given a folder), trainer kwargs,
# fields)
CASES = {
    "sft_stock_config": ("SFTTrainer", "SFTConfig", "stock", tiny.text_dataset, tiny.make_model, {}, {}),
    # trl's SFTTrainer turns a TrainingArguments into an SFTConfig (its fields, SFTConfig's defaults elsewhere).
    "sft_training_arguments": ("SFTTrainer", "SFTConfig", "transformers", tiny.text_dataset, tiny.make_model, {}, {}),
    "dpo_stock_config": ("DPOTrainer", "DPOConfig", "stock", tiny.preference_dataset, _saved_model, {}, {}),
    "reward_stock_config": (
        "RewardTrainer", "RewardConfig", "stock", tiny.preference_dataset, tiny.make_reward_model, {}, {},
    ),
    "kto_stock_config": ("KTOTrainer", "KTOConfig", "stock", tiny.preference_dataset, _saved_model, {}, {}),
    "rloo_stock_config": (
        "RLOOTrainer", "RLOOConfig", "stock", _grpo_data, _saved_model, {"reward_funcs": reward_length},
        {"max_steps": 2, "num_generations": 2, "max_completion_length": 8},
    ),
    "distillation_stock_config": (
        "DistillationTrainer", "DistillationConfig", "stock", _grpo_data, tiny.make_model,
        {"teacher_model": "seed 1"}, {"max_steps": 2, "max_completion_length": 8},
    ),
    "grpo_stock_config": (
        "GRPOTrainer", "GRPOConfig", "stock", _grpo_data, tiny.make_model, {"reward_funcs": reward_length},
        {"max_steps": 2, "num_generations": 2, "max_completion_length": 8},
    ),
}


def _model(factory, folder):
    return factory(folder) if factory is _saved_model else factory()


def _fresh(kwargs):
    """The trainer's keyword arguments, with a fresh teacher model for each run."""
    return {k: tiny.make_model(seed=1) if v == "seed 1" else v for k, v in kwargs.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_stock_config_trains_as_ours(tmp_path, name):
    trainer, config, config_side, dataset, model, kwargs, fields = CASES[name]
    if config_side == "transformers":  # only the fields a TrainingArguments has; SFTConfig's defaults elsewhere
        fields = {**{k: v for k, v in harness.BASE_FIELDS.items() if k != "max_length"}, **fields}
    runs = {}
    for side in ("stock_args", "ours"):
        with warnings.catch_warnings():
            # Nothing is dropped on the way, so nothing is said (as for a TrainingArguments given to our Trainer).
            warnings.filterwarnings("error", message=".*have no hf_lightning equivalent.*")
            runs[side] = harness.run(
                "ours", tmp_path / side, dataset(), trainer=trainer, config=config, model=_model(model, tmp_path / f"{side}_model"),
                trainer_kwargs=_fresh(kwargs), config_side=config_side if side == "stock_args" else "ours", **fields,
            )
    import hf_lightning.trl

    assert type(runs["stock_args"].trainer.args) is getattr(hf_lightning.trl, config)
    harness.assert_parity(runs["stock_args"], runs["ours"])
    assert "loss" in runs["ours"].log_history[0]


def _plain(value):
    """Enums (and lists of them) as their values: ours and transformers' enum classes differ."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value.value if isinstance(value, Enum) else value


@pytest.mark.parametrize(
    "config", ["SFTConfig", "DPOConfig", "RewardConfig", "GRPOConfig", "KTOConfig", "RLOOConfig", "DistillationConfig"]
)
def test_every_field_value_is_carried(tmp_path, config):
    import trl

    import hf_lightning.trl as ours
    from hf_lightning.trl.stock_configs import as_our_config

    extra = {"SFTConfig": {"max_length": 7, "packing": True}, "DPOConfig": {"beta": 0.3, "loss_type": "ipo"},
             "RewardConfig": {"center_rewards_coefficient": 0.01}, "GRPOConfig": {"num_generations": 4},
             "KTOConfig": {"desirable_weight": 0.7}, "RLOOConfig": {"num_generations": 4, "beta": 0.1},
             "DistillationConfig": {"beta": 0.25, "max_completion_length": 9}}[config]
    stock = getattr(trl, config)(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", learning_rate=3e-4, lr_scheduler_type="cosine",
        warmup_steps=3, per_device_train_batch_size=4, logging_steps=5, seed=11, **extra,
    )
    converted = as_our_config(stock, "Trainer", type(stock), getattr(ours, config), False)
    assert type(converted) is getattr(ours, config)
    for field in dataclasses.fields(converted):
        theirs, mine = getattr(stock, field.name), getattr(converted, field.name)
        if hasattr(theirs, "to_dict"):
            theirs, mine = theirs.to_dict(), mine.to_dict()
        assert _plain(mine) == _plain(theirs), field.name


def test_grpo_generation_batch_size_is_carried(tmp_path):
    import trl

    from hf_lightning.trl import GRPOConfig
    from hf_lightning.trl.stock_configs import as_our_config

    stock = trl.GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=2, generation_batch_size=8,
        num_generations=2,
    )
    converted = as_our_config(stock, "GRPOTrainer", trl.GRPOConfig, GRPOConfig, False)
    assert (converted.generation_batch_size, converted.steps_per_generation) == (8, 4)


def test_a_field_ours_lacks_is_named_in_a_warning(tmp_path):
    import trl

    from hf_lightning.trl import SFTTrainer

    @dataclasses.dataclass
    class MyConfig(trl.SFTConfig):
        my_knob: int = 3

    args = MyConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=1, max_length=16)
    with pytest.warns(UserWarning, match=r"SFTTrainer: MyConfig fields \['my_knob'\] have no hf_lightning"):
        trainer = SFTTrainer(
            model=tiny.make_model(), args=args, train_dataset=tiny.text_dataset(), processing_class=tiny.make_tokenizer()
        )
    assert trainer.args.max_length == 16


def test_configs_trl_does_not_convert_are_refused_by_name(tmp_path):
    import transformers
    import trl

    from hf_lightning.trl import DPOTrainer, SFTTrainer

    data = dict(train_dataset=tiny.preference_dataset(), processing_class=tiny.make_tokenizer())
    plain = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    # Stock trl refuses these too, less clearly (an AttributeError on the first missing DPO field, or
    # SFTConfig(**DPOConfig.to_dict()) failing on an unexpected keyword).
    with pytest.raises(TypeError, match=r"args: DPOTrainer takes a DPOConfig, not a transformers TrainingArguments"):
        DPOTrainer(model=tiny.make_model(), args=plain, **data)
    dpo = trl.DPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    with pytest.raises(TypeError, match=r"args: SFTTrainer takes a SFTConfig; got trl's DPOConfig"):
        SFTTrainer(model=tiny.make_model(), args=dpo, **data)


def test_init_is_trls_own_behind_the_conversion():
    import trl

    import hf_lightning.trl

    trainers = [name for name in hf_lightning.trl.__all__ if name.endswith("Trainer")]
    assert len(trainers) == 7
    for name in trainers:
        ours, stock = getattr(hf_lightning.trl, name), getattr(trl, name)
        assert ours.__init__.__wrapped__.__code__ is stock.__init__.__code__, name
