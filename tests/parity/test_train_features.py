"""train() parity for the features around the loop: RNG streams, unsized data, NaN filter, tokens,
NEFTune, activation checkpointing, torch.compile, datasets inputs, compute_loss_func, user optimizers,
auto_find_batch_size."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.data import IterableDataset

from tests.models import (
    ListDataset,
    classification_data,
    make_regression_mlp,
    make_tiny_bert_classifier,
    make_tiny_gpt2,
    padded_lm_data,
    regression_data,
)
from tests.parity.harness import assert_log_history_matches, assert_parity, run_parity

MLP_ARGS = dict(per_device_train_batch_size=3, learning_rate=1e-2, logging_steps=1, num_train_epochs=2)


class RandomRecorder(nn.Module):
    """Records one draw of the global torch RNG per forward: the dropout stream of both trainers."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1))
        self.draws: list[float] = []

    def forward(self, x, labels=None):
        self.draws.append(torch.rand(1).item())
        loss = ((x.sum(-1) * self.weight - labels) ** 2).mean()
        return {"loss": loss}


def test_global_rng_stream_matches_reference(tmp_path):
    """R3.3: dropout-like draws inside forward see the same global RNG stream (seed 42, 2 epochs)."""
    result = run_parity(RandomRecorder(), regression_data(4), tmp_path, per_device_train_batch_size=2, num_train_epochs=2)
    reference_draws = result.reference.trainer.model.draws
    assert result.ours.trainer.model.draws == reference_draws
    assert [round(v, 5) for v in reference_draws] == [0.38286, 0.95931, 0.25657, 0.79364]


class ConstantLossStream(IterableDataset):
    """5 items without a length; the model's loss is a constant 1 (R2.4)."""

    def __iter__(self):
        for i in range(5):
            yield {"x": torch.tensor([float(i)]), "labels": torch.tensor(0.0)}


class ConstantLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))

    def forward(self, x, labels=None):
        return {"loss": (self.weight * x).sum() * 0 + 1.0}


@pytest.mark.parametrize("ga,max_steps", [(2, 4), (1, 8)])
def test_unsized_dataset_carries_cut_window(tmp_path, ga, max_steps):
    result = run_parity(
        ConstantLoss(),
        ConstantLossStream(),
        tmp_path,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=ga,
        max_steps=max_steps,
        logging_steps=1,
    )
    assert_parity(result)
    if ga == 2:
        steps = result.ours.log_history[:-1]
        assert [e["epoch"] for e in steps] == [0.25, 0.5, 1.25, 1.5]
        assert [e["loss"] for e in steps] == [1.0, 1.0, 2.0, 1.0]


class NanOnMarker(nn.Module):
    """MSE whose value is NaN (without a NaN gradient) for batches holding the marker item."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x, labels=None, marker=None):
        loss = nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)
        if marker is not None and bool(marker.any()):
            loss = loss + torch.tensor(float("nan"))
        return {"loss": loss}


def test_nan_inf_filter(tmp_path):
    data = regression_data(12)
    for i, item in enumerate(data.items):
        item["marker"] = torch.tensor(i == 4)
    for nan_filter in (True, False):
        result = run_parity(
            NanOnMarker(),
            data,
            tmp_path / str(nan_filter),
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            logging_steps=2,
            learning_rate=1e-2,
            max_grad_norm=0.0,
            logging_nan_inf_filter=nan_filter,
            train_sampling_strategy="sequential",
        )
        losses = [e["loss"] for e in result.ours.log_history if "loss" in e]
        reference_losses = [e["loss"] for e in result.reference.log_history if "loss" in e]
        assert any(math.isnan(v) for v in losses) is (not nan_filter)
        for ours, ref in zip(losses, reference_losses):
            assert (math.isnan(ours) and math.isnan(ref)) or ours == pytest.approx(ref, rel=1e-5)


@pytest.mark.parametrize("mode", ["all", "non_padding"])
def test_num_input_tokens_seen(tmp_path, mode):
    result = run_parity(
        make_tiny_gpt2(),
        padded_lm_data(8),
        tmp_path,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        logging_steps=2,
        num_train_epochs=1,
        include_num_input_tokens_seen=mode,
    )
    assert_parity(result)
    ref_tokens = [e["num_input_tokens_seen"] for e in result.reference.log_history]
    assert [e["num_input_tokens_seen"] for e in result.ours.log_history] == ref_tokens


def test_ratio_logging_steps_with_first_step(tmp_path):
    result = run_parity(
        make_regression_mlp(),
        regression_data(30),
        tmp_path,
        per_device_train_batch_size=3,
        max_steps=10,
        logging_steps=0.25,
        logging_first_step=True,
        learning_rate=1e-2,
    )
    assert_parity(result)
    assert [e["step"] for e in result.ours.log_history[:-1]] == [1, 3, 6, 9]


def test_neftune_noise(tmp_path):
    result = run_parity(
        make_tiny_bert_classifier(),
        classification_data(8),
        tmp_path,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        logging_steps=1,
        num_train_epochs=1,
        neftune_noise_alpha=5.0,
    )
    assert_parity(result)
    # The hook is removed after training, as in the reference.
    embeddings = result.ours.trainer.model.get_input_embeddings()
    assert not hasattr(embeddings, "neftune_noise_alpha")


def test_activation_checkpointing(tmp_path):
    result = run_parity(
        make_tiny_gpt2(),
        padded_lm_data(8),
        tmp_path,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        logging_steps=1,
        num_train_epochs=1,
        activation_checkpointing=True,
    )
    assert_parity(result)
    assert result.ours.trainer.model.is_gradient_checkpointing


def test_torch_compile_and_empty_cache_steps(tmp_path):
    result = run_parity(
        make_regression_mlp(),
        regression_data(10),
        tmp_path,
        **MLP_ARGS,
        torch_compile=True,
        torch_compile_backend="eager",
        torch_empty_cache_steps=1,
    )
    assert_parity(result)
    trainer = result.ours.trainer
    assert trainer.model_wrapped is not trainer.model
    assert isinstance(trainer.model_wrapped, torch._dynamo.eval_frame.OptimizedModule)


def test_datasets_dataset_with_extra_columns(tmp_path):
    import datasets

    source = classification_data(10)
    table = {
        "input_ids": [item["input_ids"].tolist() for item in source.items],
        "attention_mask": [item["attention_mask"].tolist() for item in source.items],
        "label": [int(item["labels"]) for item in source.items],
        "text": [f"sentence {i}" for i in range(10)],
        "idx": list(range(10)),
    }
    result = run_parity(
        make_tiny_bert_classifier(),
        datasets.Dataset.from_dict(table),
        tmp_path,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        num_train_epochs=2,
    )
    assert_parity(result)


def _causal_lm_sum_loss(outputs, labels, num_items_in_batch=None):
    logits = outputs["logits"][..., :-1, :]
    targets = labels[..., 1:]
    loss = nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100, reduction="sum"
    )
    return loss / num_items_in_batch


def test_compute_loss_func_matches_builtin_causal_lm_loss(tmp_path):
    common = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, learning_rate=1e-3, logging_steps=1)
    with_func = run_parity(
        make_tiny_gpt2(),
        padded_lm_data(8),
        tmp_path / "func",
        trainer_kwargs={"compute_loss_func": _causal_lm_sum_loss},
        num_train_epochs=1,
        **common,
    )
    assert_parity(with_func)
    builtin = run_parity(make_tiny_gpt2(), padded_lm_data(8), tmp_path / "builtin", num_train_epochs=1, **common)
    ours_func = [e["loss"] for e in with_func.ours.log_history[:-1]]
    ours_builtin = [e["loss"] for e in builtin.ours.log_history[:-1]]
    assert ours_func == pytest.approx(ours_builtin, rel=1e-5)


def test_user_optimizer_and_optimizer_cls_and_kwargs(tmp_path):
    import copy

    import transformers

    from hf_lightning import TrainingArguments
    from hf_lightning.trainer.trainer import HFLightningTrainer

    model = make_regression_mlp()
    outputs = []
    for trainer_cls, args_cls in ((transformers.Trainer, transformers.TrainingArguments), (HFLightningTrainer, TrainingArguments)):
        side_model = copy.deepcopy(model)
        optimizer = torch.optim.SGD(side_model.parameters(), lr=0.05, momentum=0.5)
        args = args_cls(
            output_dir=str(tmp_path / trainer_cls.__module__), use_cpu=True, report_to="none", save_strategy="no",
            per_device_train_batch_size=3, logging_steps=1, num_train_epochs=2, disable_tqdm=True,
        )
        trainer = trainer_cls(model=side_model, args=args, train_dataset=regression_data(10), optimizers=(optimizer, None))
        trainer.train()
        if trainer_cls is HFLightningTrainer:
            assert trainer.optimizer is optimizer
        outputs.append(trainer.state.log_history)
    assert [e["step"] for e in outputs[1]] == [e["step"] for e in outputs[0]]
    for ref, ours in zip(outputs[0][:-1], outputs[1][:-1]):
        assert ours["loss"] == pytest.approx(ref["loss"], rel=1e-5)
        assert ours["learning_rate"] == pytest.approx(ref["learning_rate"], rel=1e-7)

    result = run_parity(
        make_regression_mlp(),
        regression_data(10),
        tmp_path / "cls",
        trainer_kwargs={"optimizer_cls_and_kwargs": (torch.optim.SGD, {"lr": 0.03, "momentum": 0.9})},
        **MLP_ARGS,
    )
    assert_parity(result)


class OutOfMemoryAbove(nn.Module):
    """Raises the CPU allocator's out-of-memory error for batches larger than `limit`."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit
        self.linear = nn.Linear(4, 1)

    def forward(self, x, labels=None):
        if x.shape[0] > self.limit:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes.")
        return {"loss": nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)}


def test_auto_find_batch_size(tmp_path):
    result = run_parity(
        OutOfMemoryAbove(limit=5),
        regression_data(20),
        tmp_path,
        per_device_train_batch_size=8,
        auto_find_batch_size=True,
        learning_rate=1e-2,
        logging_steps=1,
        num_train_epochs=1,
    )
    assert_parity(result)
    assert result.ours.trainer.state.train_batch_size == result.reference.trainer.state.train_batch_size <= 5


def test_sequential_order_every_epoch(tmp_path):
    class IndexRecorder(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(1))
            self.seen: list[int] = []

        def forward(self, idx, x, labels=None):
            self.seen.extend(idx.tolist())
            return {"loss": ((x.sum(-1) * self.weight - labels) ** 2).mean()}

    data = regression_data(6)
    items = ListDataset([{**item, "idx": i} for i, item in enumerate(data.items)])
    result = run_parity(
        IndexRecorder(), items, tmp_path, per_device_train_batch_size=4, num_train_epochs=2,
        train_sampling_strategy="sequential",
    )
    assert result.ours.trainer.model.seen == result.reference.trainer.model.seen == list(range(6)) * 2
    assert_log_history_matches(result)


def test_warns_once_when_kwargs_model_ignores_item_count(tmp_path):
    """R4.6: BERT's loss ignores num_items_in_batch yet counts as scaled -> one warning; GPT-2 uses it."""
    import warnings

    from hf_lightning import TrainingArguments
    from hf_lightning.trainer.trainer import HFLightningTrainer

    def run(model, data):
        args = TrainingArguments(
            output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True,
            per_device_train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=2,
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            HFLightningTrainer(model=model, args=args, train_dataset=data).train()
        return [w for w in caught if "num_items_in_batch" in str(w.message)]

    bert_warnings = run(make_tiny_bert_classifier(), classification_data(8))
    assert len(bert_warnings) == 1
    assert "BertForSequenceClassification" in str(bert_warnings[0].message)
    assert run(make_tiny_gpt2(), padded_lm_data(8)) == []


@pytest.mark.parametrize("strategy", ["group_by_length", "batch_rebalance"])
def test_length_aware_sampling(tmp_path, strategy):
    """Both length-aware samplers give the reference's batches, so losses match step by step."""
    result = run_parity(
        make_tiny_gpt2(),
        padded_lm_data(16),
        tmp_path,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        num_train_epochs=2,
        train_sampling_strategy=strategy,
    )
    assert_parity(result)


class TupleOutputMLP(nn.Module):
    """Returns `(loss, logits)`: the loss is the first element."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x, labels=None):
        logits = self.linear(x).squeeze(-1)
        return (nn.functional.mse_loss(logits, labels), logits)


class ModelOutputMLP(TupleOutputMLP):
    """Returns a transformers ModelOutput (a dict subclass with attribute access)."""

    def forward(self, x, labels=None):
        from transformers.modeling_outputs import SequenceClassifierOutput

        loss, logits = super().forward(x, labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)


@pytest.mark.parametrize("model_cls", [TupleOutputMLP, ModelOutputMLP])
def test_tuple_and_model_output_returning_modules(tmp_path, model_cls):
    torch.manual_seed(0)
    result = run_parity(model_cls(), regression_data(10), tmp_path, **MLP_ARGS, dataloader_drop_last=True)
    assert_parity(result)
    assert result.ours.output.global_step == 6  # 10 samples, batch 3, drop_last: 3 batches x 2 epochs


def test_bf16_autocasts_only_the_forward(tmp_path):
    """R7.6: bf16 on CPU; a compute_loss_func sees float32 logits; losses match the reference's."""
    seen_dtypes = []

    def loss_func(outputs, labels, num_items_in_batch=None):
        seen_dtypes.append(outputs["logits"].dtype)
        return nn.functional.cross_entropy(outputs["logits"], labels)

    result = run_parity(
        make_tiny_bert_classifier(),
        classification_data(8),
        tmp_path,
        trainer_kwargs={"compute_loss_func": loss_func},
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        logging_steps=1,
        num_train_epochs=1,
        bf16=True,
    )
    assert_parity(result)
    assert set(seen_dtypes) == {torch.float32}


@pytest.mark.parametrize("name", ["reduce_lr_on_plateau", "greedy"])
def test_metric_driven_schedulers_step_after_evaluation(tmp_path, name):
    """The two metric-driven schedules are stepped with eval_loss after each evaluation, as the reference."""
    kwargs = {"patience": 0, "factor": 0.5} if name == "reduce_lr_on_plateau" else {"patience": 0, "min_lr": 1e-5}
    result = run_parity(
        make_regression_mlp(),
        regression_data(12),
        tmp_path,
        trainer_kwargs={"eval_dataset": regression_data(6, seed=3)},
        per_device_train_batch_size=3,
        learning_rate=5e-2,
        logging_steps=1,
        num_train_epochs=3,
        eval_strategy="steps",
        eval_steps=2,
        lr_scheduler_type=name,
        lr_scheduler_kwargs=kwargs,
    )
    assert_parity(result)
    learning_rates = [e["learning_rate"] for e in result.ours.log_history if "learning_rate" in e]
    assert len(set(learning_rates)) > 1  # the schedule did react to the metric


def test_second_train_call_matches_reference(tmp_path):
    """A second train() starts a fresh state and schedule but keeps the optimizer, as the reference."""
    import copy

    import transformers

    from hf_lightning import TrainingArguments
    from hf_lightning.trainer.trainer import HFLightningTrainer

    model = make_regression_mlp()
    histories = []
    for trainer_cls, args_cls in ((transformers.Trainer, transformers.TrainingArguments), (HFLightningTrainer, TrainingArguments)):
        args = args_cls(
            output_dir=str(tmp_path / trainer_cls.__module__), use_cpu=True, report_to="none", save_strategy="no",
            disable_tqdm=True, per_device_train_batch_size=3, logging_steps=1, num_train_epochs=1, learning_rate=1e-2,
        )
        trainer = trainer_cls(model=copy.deepcopy(model), args=args, train_dataset=regression_data(9))
        trainer.train()
        trainer.train()
        histories.append(trainer.state.log_history[:-1])
    assert [e["step"] for e in histories[1]] == [e["step"] for e in histories[0]] == [1, 2, 3]
    for ours, reference in zip(histories[1], histories[0]):
        assert ours["loss"] == pytest.approx(reference["loss"], rel=1e-6)
        assert ours["learning_rate"] == pytest.approx(reference["learning_rate"], rel=1e-9)


def test_model_init_is_called_again_at_train(tmp_path):
    calls = {"count": 0}

    def model_init():
        calls["count"] += 1
        return RandomRecorder()  # built after set_seed(seed): the same initial weights on both sides

    result = run_parity(
        None, regression_data(6), tmp_path, trainer_kwargs={"model_init": model_init},
        per_device_train_batch_size=2, num_train_epochs=1, logging_steps=1,
    )
    assert_parity(result)
    assert calls["count"] == 4  # 1 at construction + 1 at train(), on each side


def test_the_tokenizers_special_tokens_reach_the_model_config_at_train(tmp_path):
    """The reference's train() copies a transformers tokenizer's PAD / BOS / EOS ids into the model config and
    generation config (a pad token added for fine-tuning): the saved config.json then holds them."""
    import json

    from transformers import GPT2Config, GPT2LMHeadModel

    from tests.trl.tiny import make_tokenizer

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2))
    assert model.config.pad_token_id is None and model.config.eos_token_id == 50256
    tokenizer = make_tokenizer()
    result = run_parity(
        model, padded_lm_data(4), tmp_path, trainer_kwargs={"processing_class": tokenizer},
        per_device_train_batch_size=2, max_steps=1,
    )
    saved = {}
    for side in ("reference", "ours"):
        trainer = getattr(result, side).trainer
        config = trainer.model.config
        generation = trainer.model.generation_config
        assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (0, 2, 1)
        assert (generation.pad_token_id, generation.bos_token_id) == (0, 2)
        trainer.save_model(str(tmp_path / side / "model"))
        with open(tmp_path / side / "model" / "config.json") as f:
            saved[side] = json.load(f)
    assert saved["ours"] == saved["reference"]
    assert_parity(result)
