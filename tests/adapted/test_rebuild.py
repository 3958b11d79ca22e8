"""`on_lightning` and `hf_lightning.adapted.<module>` on a small library written like sentence-transformers': what a
rebuild keeps (the library's function code, decorated `super()` calls, abstract methods, class attributes naming
rebuilt classes, dataclass fields with string annotations) and what it leaves alone (models)."""

from __future__ import annotations

import dataclasses
import importlib
import typing

import pytest
import transformers

from hf_lightning import HfArgumentParser, on_lightning
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.adapted import library_stub as stock
from tests.models import make_regression_mlp, regression_data

ADAPTED = "hf_lightning.adapted.tests.adapted.library_stub"


def test_classes_come_back_in_the_order_given_once_per_process():
    trainer, arguments = on_lightning(stock.StubTrainer, stock.StubArguments)
    assert on_lightning(stock.StubArguments) is arguments
    assert on_lightning(stock.StubArguments, stock.StubTrainer) == (arguments, trainer)
    module = importlib.import_module(ADAPTED)
    assert module.StubTrainer is trainer and module.StubArguments is arguments
    assert (trainer.__module__, trainer.__qualname__) == (ADAPTED, "StubTrainer")
    assert on_lightning(HFLightningTrainer) is HFLightningTrainer
    assert on_lightning(transformers.Trainer) is HFLightningTrainer


def test_the_chain_is_rebuilt_over_ours_from_the_library_s_own_code():
    trainer = on_lightning(stock.StubTrainer)
    base = trainer.__mro__[1]
    assert base.__qualname__ == "BaseStubTrainer" and base.__mro__[1] is HFLightningTrainer
    # docs/divergences.md: a rebuilt trainer is no transformers.Trainer.
    assert not issubclass(trainer, transformers.Trainer)
    method = vars(trainer)["default_loss"]
    assert method.__code__ is vars(stock.StubTrainer)["default_loss"].__code__
    assert base.training_args_class is on_lightning(stock.StubArguments)  # the class attribute follows
    assert base.__abstractmethods__ == frozenset({"default_loss"}) and not trainer.__abstractmethods__
    with pytest.raises(TypeError, match="abstract"):
        base(model=make_regression_mlp())


def test_arguments_are_ours_with_the_library_s_fields_and_their_string_annotations(tmp_path):
    arguments = on_lightning(stock.StubArguments)
    names = [f.name for f in dataclasses.fields(arguments)]
    assert names[-1] == "knob" and "output_dir" in names
    assert typing.get_type_hints(arguments)["knob"] == typing.Optional[int]
    (parsed,) = HfArgumentParser(arguments).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--knob", "5", "--use_cpu", "True"]
    )
    assert type(parsed) is arguments and parsed.knob == 5


def test_a_decorated_method_s_super_reaches_our_engine(tmp_path):
    trainer_cls, arguments = on_lightning(stock.StubTrainer, stock.StubArguments)
    args = arguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=2,
                     per_device_train_batch_size=2, disable_tqdm=True)
    trainer = trainer_cls(model=make_regression_mlp(), args=args, train_dataset=regression_data(4))
    trainer.train()
    assert trainer.decorated_calls == 2 and trainer.lightning_trainer is not None
    with pytest.raises(ValueError, match="pass a StubArguments"):  # the library's own check, on ours
        trainer_cls(model=make_regression_mlp(), args=stock.StubArguments(output_dir=str(tmp_path)))


def test_a_class_whose_code_builds_a_trainer_is_rebuilt_a_model_is_not(tmp_path):
    runner = on_lightning(stock.Runner)(make_regression_mlp(), str(tmp_path))
    assert type(runner.trainer) is on_lightning(stock.StubTrainer)
    module = importlib.import_module(ADAPTED)
    assert module.StubModel is stock.StubModel  # its fit() builds a trainer, but a model stays the library's
    assert module.renamed is stock.renamed


def test_what_cannot_be_adapted_is_refused_by_name():
    with pytest.raises(TypeError, match="at least one class"):
        on_lightning()
    with pytest.raises(TypeError, match=r"on_lightning\(StubModel\).*neither subclasses transformers.Trainer"):
        on_lightning(stock.StubModel)
    with pytest.raises(TypeError, match="takes classes"):
        on_lightning(stock.StubArguments(output_dir="unused"))
