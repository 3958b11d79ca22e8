"""The override guarantee: every method of `transformers.Trainer` is, in `engine/overridable.py`, either called by
the engine where the reference calls it, public API neither loop calls, or refused when a subclass overrides it.

The walk records, in the same scenarios (train with logging, evaluation, checkpoints, the best model and stubbed
Hub pushes; evaluate; predict; a resume with `model_init`), which of the reference's methods each library calls,
each wrapped in a subclass that calls `super()`; then each table entry is held to what was observed."""

from __future__ import annotations

import collections
import functools

import pytest
import transformers

from hf_lightning import Trainer, TrainingArguments
from hf_lightning.engine.overridable import OVERRIDES, Called, Refused, UserApi
from tests.models import make_regression_mlp, regression_data

REFERENCE_METHODS = sorted(name for name, value in vars(transformers.Trainer).items() if callable(value))
# The Hub is stubbed: these record the call and do not run the method (no server in this test; the pushes
# themselves are compared in tests/integrations/test_hub.py).
HUB_STUBS = ("init_hf_repo", "_push_from_checkpoint", "_finish_current_push")
# Helpers whose call count depends on the engine's own structure (the same calls, more or fewer times).
COUNT_MAY_DIFFER = {
    "_prepare_input": "recursion over the batch's containers",
    "get_tp_size": "read by the data layout and the strategy choice",
    "get_sp_size": "read once per run",
}
# Called where no scenario here goes: where their call is pinned instead.
CALLED_OUTSIDE_THESE_SCENARIOS = {
    "create_model_card": "push_to_hub() (tests/integrations/test_hub.py)",
    "_load_callback_state": "restore_callback_states_from_checkpoint (tests/parity/test_resume.py, the loading "
    "override points in the reference's order)",
    "_tune_save_checkpoint": "hyperparameter_search(backend='ray') (tests/integrations/test_ray_tune.py, an override "
    "leaves a file in every trial checkpoint)",
}


def _recording(base: type, names: list[str]) -> type:
    namespace = {}
    holder: list[type] = []
    for name in names:
        original = getattr(base, name, None)
        if original is None:
            continue

        def make(name=name, original=original):
            @functools.wraps(original)
            def record(self, *args, **kwargs):
                self.__dict__.setdefault("_calls", []).append(name)
                if name in HUB_STUBS:
                    return None
                return getattr(super(holder[0], self), name)(*args, **kwargs)

            return record

        namespace[name] = make()
    cls = type(f"Recording{base.__name__}", (base,), namespace)
    holder.append(cls)
    return cls


def _scenarios(base: type, args_cls: type, out, names: list[str]) -> collections.Counter:
    cls = _recording(base, names)

    def args(**fields):
        return args_cls(
            output_dir=str(out), use_cpu=True, report_to="none", per_device_train_batch_size=2, max_steps=6,
            logging_steps=1, eval_strategy="steps", eval_steps=2, save_steps=2, load_best_model_at_end=True,
            metric_for_best_model="eval_loss", save_total_limit=3, disable_tqdm=True, seed=0, push_to_hub=True,
            hub_model_id="user/tiny", **fields,
        )

    data, evaluation = regression_data(16), regression_data(6, seed=1)
    first = cls(model=make_regression_mlp(), args=args(), train_dataset=data, eval_dataset=evaluation)
    first.train()
    first.evaluate()
    first.predict(regression_data(4, seed=2))
    resumed = cls(model_init=lambda: make_regression_mlp(), args=args(), train_dataset=data, eval_dataset=evaluation)
    resumed.train(resume_from_checkpoint=str(out / "checkpoint-4"))
    return collections.Counter(first.__dict__["_calls"] + resumed.__dict__["_calls"])


@pytest.fixture(scope="module")
def calls(tmp_path_factory):
    names = [name for name in REFERENCE_METHODS if name != "__init__"]
    reference = _scenarios(
        transformers.Trainer, transformers.TrainingArguments, tmp_path_factory.mktemp("reference"), names
    )
    called = [name for name in names if isinstance(OVERRIDES.get(name), Called)]
    ours = _scenarios(Trainer, TrainingArguments, tmp_path_factory.mktemp("ours"), called)
    return reference, ours


def test_every_reference_method_has_an_entry():
    assert set(REFERENCE_METHODS) - set(OVERRIDES) == set()
    for name, rule in OVERRIDES.items():
        if isinstance(rule, Called):
            assert callable(getattr(Trainer, name, None)), f"{name} is marked called but the facade lacks it"


@pytest.mark.slow
def test_each_called_method_is_called_as_often_as_the_reference_calls_it(calls):
    reference, ours = calls
    for name, rule in OVERRIDES.items():
        if not isinstance(rule, Called) or name == "__init__" or name in CALLED_OUTSIDE_THESE_SCENARIOS:
            continue
        assert ours[name] > 0, f"{name} is marked called ({rule.when}) but the engine never called it"
        assert reference[name] > 0, f"{name}: the reference never called it here; the entry should say so"
        if name not in COUNT_MAY_DIFFER:
            assert ours[name] == reference[name], (name, ours[name], reference[name])


@pytest.mark.slow
def test_every_method_the_reference_loop_calls_is_called_or_refused(calls):
    reference, _ = calls
    for name in reference:
        assert not isinstance(OVERRIDES[name], UserApi), f"the reference's loop calls {name}: not user-only API"
    for name, rule in OVERRIDES.items():
        if isinstance(rule, UserApi):
            assert reference[name] == 0, name


@pytest.mark.parametrize("name", sorted(name for name, rule in OVERRIDES.items() if isinstance(rule, Refused)))
def test_an_override_the_engine_never_calls_is_refused_at_construction(tmp_path, name):
    subclass = type(f"Overrides_{name.strip('_')}", (Trainer,), {name: lambda self, *args, **kwargs: None})
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    with pytest.raises(TypeError, match=rf"{subclass.__qualname__}\.{name}: ") as refusal:
        subclass(model=make_regression_mlp(), args=args, train_dataset=regression_data(4))
    assert OVERRIDES[name].instead in str(refusal.value)
    assert not (tmp_path / "runs").exists()


def test_a_called_override_is_accepted_and_a_library_class_is_checked_as_the_library_s(tmp_path):
    class Mine(Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            return super().training_step(model, inputs, num_items_in_batch)

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    Mine(model=make_regression_mlp(), args=args, train_dataset=regression_data(4))


def test_end_destroys_the_default_process_group(tmp_path):
    """`Trainer.end()` (reference API a script calls last): the default process group is gone afterwards."""
    import socket

    import torch.distributed as dist

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
        Trainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(4)).end()
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
