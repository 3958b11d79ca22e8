"""Each component's port (the small protocol beside it naming what it uses of the trainer) describes the real
facade: every method it names is a method of `Trainer` taking the port's parameters first, every attribute is a
class attribute or set somewhere in the package. A port that drifts from the facade fails here, not in a run."""

from __future__ import annotations

import inspect

import pytest

from hf_lightning import Trainer
from hf_lightning.callbacks.state import TrialReferences
from hf_lightning.checkpoint.checkpointer import SaveHooks
from hf_lightning.checkpoint.staging import StagingSource
from hf_lightning.engine.module import HFLightningModule
from hf_lightning.evaluation.loop import EvaluationHooks
from hf_lightning.integrations.hp_search import OptunaTrainer
from hf_lightning.integrations.ray_tune import SearchedTrainer
from hf_lightning.integrations.ray_tune_workers import TrialTrainer
from hf_lightning.strategies.ports import (
    CheckpointIOOwner,
    HandOverModule,
    ProcessLayout,
    ScheduleBuilder,
    UserParts,
)
from tests.architecture.test_ports import _assigned_attribute_names, _members

PORTS = [
    StagingSource, SaveHooks, EvaluationHooks, TrialReferences, TrialTrainer, SearchedTrainer, OptunaTrainer,
    CheckpointIOOwner, ProcessLayout, ScheduleBuilder, UserParts,
]


@pytest.mark.parametrize("port", PORTS, ids=lambda port: port.__name__)
def test_every_port_method_is_a_facade_method_taking_its_parameters(port):
    methods, _ = _members(port)
    assert methods, f"{port.__name__} names no method"
    for name, member in methods.items():
        ours = inspect.getattr_static(Trainer, name, None)
        assert ours is not None, f"{port.__name__}.{name}: Trainer has no such member"
        if isinstance(member, property):
            assert isinstance(ours, property), f"{port.__name__}.{name} is a property; Trainer's is not"
            continue
        expected = list(inspect.signature(member).parameters)
        actual = list(inspect.signature(ours).parameters)
        assert actual[: len(expected)] == expected, f"{port.__name__}.{name}: Trainer takes {actual}"


@pytest.mark.parametrize("port", PORTS, ids=lambda port: port.__name__)
def test_every_port_attribute_is_set_by_the_facade(port):
    _, attributes = _members(port)
    assigned = _assigned_attribute_names()
    missing = [name for name in sorted(attributes) if not hasattr(Trainer, name) and name not in assigned]
    assert attributes and missing == [], f"{port.__name__}: never set on the trainer: {missing}"


def test_the_module_port_of_the_wrapping_strategies_describes_our_lightning_module():
    methods, attributes = _members(HandOverModule)
    for name, member in methods.items():
        ours = inspect.getattr_static(HFLightningModule, name, None)
        assert ours is not None, f"HandOverModule.{name}: HFLightningModule has no such member"
        assert list(inspect.signature(ours).parameters) == list(inspect.signature(member).parameters)
    assigned = _assigned_attribute_names()
    assert set(attributes) == {"facade", "model"} and set(attributes) <= assigned
