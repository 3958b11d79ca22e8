"""The facade in one room: every class `HFLightningTrainer` and `HFLightningSeq2SeqTrainer` are built from (their MRO
members defined in hf_lightning) is defined in `hf_lightning/trainer/`, so the override points live together and
the components below receive what they need instead of being mixed into the facade."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from hf_lightning import Seq2SeqTrainer, Trainer

PACKAGE = Path(__file__).resolve().parents[2] / "hf_lightning"
ROOM = PACKAGE / "trainer"


def package_classes(cls: type) -> list[type]:
    """The classes of `cls`'s MRO whose code is hf_lightning's."""
    return [member for member in cls.__mro__ if member.__module__.split(".")[0] == "hf_lightning"]


@pytest.mark.parametrize("facade", [Trainer, Seq2SeqTrainer], ids=lambda facade: facade.__name__)
def test_every_class_of_the_facade_is_defined_in_the_room(facade: type) -> None:
    members = package_classes(facade)
    outside = [
        f"{member.__module__}.{member.__qualname__} ({Path(inspect.getsourcefile(member)).relative_to(PACKAGE)})"
        for member in members
        if ROOM not in Path(inspect.getsourcefile(member)).resolve().parents
    ]
    assert not outside, "classes of the facade defined outside hf_lightning/trainer/ (move them into the room):\n" + (
        "\n".join(outside)
    )
    assert all(member.__module__.startswith("hf_lightning.trainer.") for member in members), members


def test_the_room_check_sees_the_mixins() -> None:
    members = package_classes(Trainer)
    assert len(members) >= 10, members  # the facade and its nine mixins: the check above is not vacuous
    assert package_classes(Seq2SeqTrainer)[1:] == members


def test_a_class_outside_the_room_would_be_found() -> None:
    from hf_lightning.engine.module import HFLightningModule

    assert ROOM not in Path(inspect.getsourcefile(HFLightningModule)).resolve().parents
