"""On CPU an update's freed gradients are held until the next backward (engine/held_gradients.py): every `.grad` reads
as the reference's, the run is the reference's, and nothing is held across an evaluation, a save or the end."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import TrainerCallback

from hf_lightning import TrainingArguments
from hf_lightning.engine.held_gradients import HELD_GRADIENTS_FLOOR_BYTES, HeldGradients
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.models import make_regression_mlp, regression_data
from tests.parity.harness import assert_parity, run_parity


class WideRegressor(nn.Module):
    """A regression MLP whose gradients (about 1.5 MiB) are above the holding floor."""

    def __init__(self, seed: int = 0, in_features: int = 4, hidden: int = 600):
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )

    def forward(self, x, labels=None):
        prediction = self.net(x).squeeze(-1)
        output = {"logits": prediction}
        if labels is not None:
            output = {"loss": nn.functional.mse_loss(prediction, labels), **output}
        return output


def _parameter_bytes(model: nn.Module) -> int:
    return sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())


def _held(trainer) -> HeldGradients | None:
    return trainer.lightning_trainer.lightning_module._fit.held_gradients


class GradientWatcher(TrainerCallback):
    """What a callback sees: every `.grad` at each step end, and whether gradients are held at evaluation and save."""

    def __init__(self) -> None:
        self.trainer = None
        self.grads_none_at_step_end: list[bool] = []
        self.holding_at_step_begin: list[bool] = []
        self.holding_at_evaluate: list[bool] = []
        self.holding_at_save: list[bool] = []

    def _holding(self) -> bool:
        held = _held(self.trainer)
        return held is not None and held.holding

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step > 0:
            held = _held(self.trainer)
            # Holding means the previous update's gradient tensors, not a list of the Nones zero_grad() left.
            self.holding_at_step_begin.append(
                held is not None and held.holding and all(grad is not None for grad in held._held)
            )

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.grads_none_at_step_end.append(all(parameter.grad is None for parameter in model.parameters()))

    def on_evaluate(self, args, state, control, **kwargs):
        self.holding_at_evaluate.append(self._holding())

    def on_save(self, args, state, control, **kwargs):
        self.holding_at_save.append(self._holding())


def _train(tmp_path, model, *, reuse: bool = True, **fields) -> tuple[HFLightningTrainer, GradientWatcher]:
    args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        per_device_train_batch_size=4,
        num_train_epochs=2,
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        seed=5,
        **{"save_strategy": "no", **fields},
    )
    watcher = GradientWatcher()
    trainer = HFLightningTrainer(
        model=model, args=args, train_dataset=regression_data(16), eval_dataset=regression_data(8, seed=1),
        callbacks=[watcher],
    )
    trainer.reuse_gradient_memory = reuse
    watcher.trainer = trainer
    trainer.train()
    return trainer, watcher


def test_the_wide_model_is_above_the_floor_and_the_test_mlp_below_it():
    assert _parameter_bytes(WideRegressor()) >= HELD_GRADIENTS_FLOOR_BYTES
    assert _parameter_bytes(make_regression_mlp()) < HELD_GRADIENTS_FLOOR_BYTES


def test_the_run_with_held_gradients_is_the_reference_run(tmp_path):
    result = run_parity(
        WideRegressor(), regression_data(16), tmp_path, per_device_train_batch_size=4, num_train_epochs=2,
        logging_steps=1, seed=5,
    )
    assert _held(result.ours.trainer) is not None  # the holding path ran
    assert_parity(result)


def test_holding_or_not_gives_the_same_run_bit_for_bit(tmp_path):
    held, _ = _train(tmp_path / "held", WideRegressor())
    freed, _ = _train(tmp_path / "freed", WideRegressor(), reuse=False)

    assert _held(held) is not None
    assert _held(freed) is None  # `reuse_gradient_memory = False`: freed at zero_grad, as the reference
    assert [entry.get("loss") for entry in held.state.log_history] == [
        entry.get("loss") for entry in freed.state.log_history
    ]
    for ours, theirs in zip(held.model.state_dict().values(), freed.model.state_dict().values()):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize(
    "schedule",
    [
        {"eval_strategy": "steps", "eval_steps": 3, "save_strategy": "steps", "save_steps": 4},
        {"eval_strategy": "epoch", "save_strategy": "epoch"},
    ],
    ids=["steps", "epoch"],
)
def test_every_grad_reads_none_after_an_update_and_nothing_is_held_at_evaluation_save_or_the_end(tmp_path, schedule):
    trainer, watcher = _train(tmp_path, WideRegressor(), **schedule)

    assert trainer.state.global_step == 8
    assert watcher.grads_none_at_step_end == [True] * 8  # as after the reference's zero_grad
    # Held from one update into the next (the next step's backward releases them) ...
    assert any(watcher.holding_at_step_begin)
    # ... but never across an evaluation or a save, nor once train() returns.
    assert watcher.holding_at_evaluate and not any(watcher.holding_at_evaluate)
    assert watcher.holding_at_save and not any(watcher.holding_at_save)
    assert not _held(trainer).holding


def test_held_gradients_are_the_previous_update_s_and_go_at_the_next_backward():
    model = WideRegressor()
    model(torch.randn(2, 4), labels=torch.randn(2))["loss"].backward()
    held = HeldGradients(list(model.parameters()))
    previous = [parameter.grad for parameter in model.parameters()]

    held.hold()
    model.zero_grad()

    assert held.holding and all(parameter.grad is None for parameter in model.parameters())
    assert all(kept is grad for kept, grad in zip(held._held, previous))
    held.release()
    assert not held.holding


def test_the_next_backward_releases_them(tmp_path):
    import lightning.pytorch as pl

    class AroundBackward(pl.Callback):
        def __init__(self) -> None:
            self.before: list[bool] = []
            self.after: list[bool] = []

        def on_before_backward(self, trainer, pl_module, loss):
            self.before.append(pl_module._fit.held_gradients.holding)

        def on_after_backward(self, trainer, pl_module):
            self.after.append(pl_module._fit.held_gradients.holding)

    around = AroundBackward()
    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4, max_steps=4, report_to="none",
        disable_tqdm=True, save_strategy="no",
    )
    trainer = HFLightningTrainer(model=WideRegressor(), args=args, train_dataset=regression_data(16), callbacks=[around])
    trainer.train()

    # Lightning's hooks run inside the backward call, after the release: nothing is held while the backward runs.
    assert around.after == [False] * 4 and around.before == [False] * 4
    assert trainer.state.global_step == 4


def test_a_failed_fit_holds_nothing_afterwards(tmp_path):
    class FailsAtStepTwo(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                raise RuntimeError("stop here")

    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4, max_steps=4, report_to="none",
        disable_tqdm=True, save_strategy="no",
    )
    trainer = HFLightningTrainer(
        model=WideRegressor(), args=args, train_dataset=regression_data(16), callbacks=[FailsAtStepTwo()]
    )
    with pytest.raises(RuntimeError, match="stop here"):
        trainer.train()

    held = trainer.lightning_trainer.lightning_module._fit.held_gradients
    assert held is not None and not held.holding  # the fit's `finally` let the step-2 gradients go


def test_gradient_accumulation_with_held_gradients_is_the_reference_run(tmp_path):
    result = run_parity(
        WideRegressor(), regression_data(16), tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=2,
        num_train_epochs=2, logging_steps=1, seed=5,
    )
    assert _held(result.ours.trainer) is not None
    assert_parity(result)


def test_an_accelerator_backward_with_arguments_releases_them(tmp_path):
    class RetainingTrainer(HFLightningTrainer):
        """A subclass's training step as TRL writes some: `accelerator.backward(loss, **kwargs)`."""

        held_at_backward: list[bool] = []

        def training_step(self, model, inputs, num_items_in_batch=None):
            model.train()
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
            self.accelerator.backward(loss, retain_graph=True)
            self.held_at_backward.append(_held(self).holding)
            return loss.detach()

    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4, max_steps=3, report_to="none",
        disable_tqdm=True, save_strategy="no",
    )
    trainer = RetainingTrainer(model=WideRegressor(), args=args, train_dataset=regression_data(16))
    trainer.train()

    assert trainer.held_at_backward == [False, False, False]


def test_auto_find_batch_size_holds_nothing(tmp_path):
    trainer, _ = _train(tmp_path, WideRegressor(), auto_find_batch_size=True)
    assert _held(trainer) is None


@pytest.mark.parametrize(
    ("model", "device", "plain", "enabled"),
    [
        ("small", "cpu", True, True),  # below the floor: malloc's bins reuse the memory already
        ("wide", "cuda", True, True),  # CUDA's caching allocator reuses its blocks
        ("wide", "cpu", False, True),  # DDP / FSDP: not the plain one-device update
        ("wide", "cpu", "bf16", True),  # a precision plugin around the update
        ("wide", "cpu", True, False),  # `reuse_gradient_memory = False`
        ("frozen", "cpu", True, True),  # a large frozen model with a small trainable part (an adapter)
    ],
)
def test_no_holding_where_it_wins_nothing_or_is_switched_off(model, device, plain, enabled):
    from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

    built = make_regression_mlp() if model == "small" else WideRegressor()
    if model == "frozen":
        for parameter in built.net[2].parameters():  # the 600 x 600 layer: the rest is under the floor
            parameter.requires_grad_(False)
    from lightning.pytorch.plugins.precision import MixedPrecision

    if plain == "bf16":
        strategy = SingleDeviceStrategy(device="cpu", precision_plugin=MixedPrecision("bf16-mixed", "cpu"))
    else:
        strategy = SingleDeviceStrategy(device="cpu") if plain else DDPStrategy()

    assert HeldGradients.for_fit(built, torch.device(device), strategy, enabled) is None
    assert HeldGradients.for_fit(WideRegressor(), torch.device("cpu"), SingleDeviceStrategy("cpu"), True) is not None
