"""`DataContext`: what every DataLoader of one trainer is built from, in one object (the dataloader builders take it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hf_lightning.translation.plan import ModuleSettings


@dataclass(frozen=True)
class DataContext:
    """The arguments, collator, model (its signature decides column removal), tokenizer and process layout a
    trainer's train, eval and test loaders share.

    `data_collator=None` picks the reference's default for `processing_class`; `settings` are the trainer's plan's
    module settings; `columns` the columns column removal keeps (the trainer's
    `_signature_columns`; the model's signature when None). `world_size` / `process_index` are the data-parallel
    replicas and this process's replica.
    """

    args: Any
    data_collator: Callable | None
    model: Any
    settings: ModuleSettings
    processing_class: Any = None
    world_size: int = 1
    process_index: int = 0
    columns: list[str] | None = None
