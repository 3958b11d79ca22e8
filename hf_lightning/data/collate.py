"""Batch collation with the reference's behaviour, quirks included (R3.10, R3.11).

Ports of transformers' `default_data_collator` (torch flavour), `DataCollatorWithPadding` and
`RemoveColumnsCollator`, so that transformers stays optional.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

# Classes for which the reference's Trainer picks `DataCollatorWithPadding` (an isinstance check there).
_PADDING_PROCESSOR_BASES = frozenset({"PreTrainedTokenizerBase", "SequenceFeatureExtractor"})


def default_data_collator(features: Sequence[Any], return_tensors: str = "pt") -> dict[str, Any]:
    """Stack a list of dict-like examples into a batch of tensors, exactly as the reference does.

    Keys are decided by the first example; `label` / `label_ids` become `labels`; strings and `None`
    are dropped; non-mapping examples go through `vars()` (so tuples raise TypeError).
    """
    if return_tensors != "pt":
        raise ValueError(
            f"default_data_collator: return_tensors={return_tensors!r} is not supported; hf_lightning "
            "collates to torch tensors, use return_tensors='pt'."
        )
    if type(features[0]) is not dict and not isinstance(features[0], Mapping):  # `dict` skips the ABC check
        features = [vars(f) for f in features]
    first = features[0]
    batch: dict[str, Any] = {}

    if "label" in first and first["label"] is not None:
        label = first["label"].item() if isinstance(first["label"], torch.Tensor) else first["label"]
        dtype = torch.long if isinstance(label, (int, np.integer)) else torch.float
        batch["labels"] = torch.tensor([f["label"] for f in features], dtype=dtype)
    elif "label_ids" in first and first["label_ids"] is not None:
        if isinstance(first["label_ids"], torch.Tensor):
            batch["labels"] = torch.stack([f["label_ids"] for f in features])
        else:
            dtype = torch.long if isinstance(first["label_ids"][0], (int, np.integer)) else torch.float
            batch["labels"] = torch.tensor([f["label_ids"] for f in features], dtype=dtype)

    for key, value in first.items():
        if key in ("label", "label_ids") or value is None or isinstance(value, str):
            continue
        if isinstance(value, torch.Tensor):
            batch[key] = torch.stack([f[key] for f in features])
        elif isinstance(value, np.ndarray):
            batch[key] = torch.from_numpy(np.stack([f[key] for f in features]))
        else:
            batch[key] = torch.tensor([f[key] for f in features])
    return batch


@dataclass
class DataCollatorWithPadding:
    """Pad a batch with the tokenizer's own `pad` method, then rename `label`/`label_ids` to `labels`."""

    tokenizer: Any
    padding: bool | str = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = _pad_quietly(
            self.tokenizer,
            features,
            padding=self.padding,
            max_length=self.max_length,
            pad_to_multiple_of=self.pad_to_multiple_of,
            return_tensors=self.return_tensors,
        )
        if "label" in batch:
            batch["labels"] = batch["label"]
            del batch["label"]
        if "label_ids" in batch:
            batch["labels"] = batch["label_ids"]
            del batch["label_ids"]
        return batch


def _pad_quietly(tokenizer: Any, *pad_args: Any, **pad_kwargs: Any) -> Any:
    # Fast tokenizers warn that calling `pad` is slower than `__call__`; the reference silences it here.
    warnings_state = getattr(tokenizer, "deprecation_warnings", None)
    if warnings_state is None:
        return tokenizer.pad(*pad_args, **pad_kwargs)
    previous = warnings_state.get("Asking-to-pad-a-fast-tokenizer", False)
    warnings_state["Asking-to-pad-a-fast-tokenizer"] = True
    try:
        return tokenizer.pad(*pad_args, **pad_kwargs)
    finally:
        warnings_state["Asking-to-pad-a-fast-tokenizer"] = previous


class RemoveColumnsCollator:
    """Drop the keys the model's `forward` does not accept from each dict example, then collate (R3.11).

    Non-dict examples pass through untouched, as in the reference.
    """

    def __init__(
        self,
        data_collator: Callable[[list[Any]], Any],
        signature_columns: Sequence[str],
        logger: logging.Logger | None = None,
        model_name: str | None = None,
        description: str | None = None,
    ) -> None:
        self.data_collator = data_collator
        self.signature_columns = signature_columns
        self._columns = frozenset(signature_columns)
        self.logger = logger
        self.description = description
        self.model_name = model_name
        self.message_logged = False

    def _remove_columns(self, feature: Any) -> Any:
        if not isinstance(feature, dict):
            return feature
        if feature.keys() <= self._columns:
            # Nothing to drop (the common case): a shallow copy, as the reference returns a new dict,
            # without its per-example set arithmetic.
            return dict(feature)
        if not self.message_logged and self.logger and self.model_name:
            ignored_columns = list(set(feature.keys()) - set(self.signature_columns))
            if len(ignored_columns) > 0:
                self.logger.info(ignored_columns_message(ignored_columns, self.model_name, self.description))
                self.message_logged = True
        return {k: v for k, v in feature.items() if k in self._columns}

    def __call__(self, features: list[Any]) -> Any:
        columns = self._columns
        if self.data_collator is default_data_collator and _plain_dicts_within(features, columns):
            # Nothing to drop, and this collator only reads the examples: the reference's per-example
            # copies could not be told apart from the examples themselves.
            return default_data_collator(features)
        # Plain dicts with nothing to drop are copied inline (the common case, one call fewer per example).
        return self.data_collator(
            [
                dict(feature)
                if type(feature) is dict and feature.keys() <= columns
                else self._remove_columns(feature)
                for feature in features
            ]
        )


def _plain_dicts_within(features: Sequence[Any], columns: frozenset) -> bool:
    """Whether every example is a plain `dict` whose keys are all in `columns`. Checked with C iterators (`map`
    over `type` and `dict.keys`), not a Python loop: this runs on every batch the loader collates."""
    if {*map(type, features)} != {dict}:  # also False for no example at all
        return False
    return all(map(columns.issuperset, map(dict.keys, features)))


def ignored_columns_message(ignored_columns: Sequence[str], model_name: str, description: str | None) -> str:
    """The reference's info message listing the columns dropped because `forward` does not take them."""
    dset_description = "" if description is None else f"in the {description} set"
    names = ", ".join(ignored_columns)
    return (
        f"The following columns {dset_description} don't have a corresponding argument in "
        f"`{model_name}.forward` and have been ignored: {names}."
        f" If {names} are not expected by `{model_name}.forward`, "
        " you can safely ignore this message."
    )


def is_padding_processor(processing_class: Any) -> bool:
    """True for a transformers tokenizer or sequence feature extractor (checked by class, no import)."""
    return any(
        cls.__name__ in _PADDING_PROCESSOR_BASES and cls.__module__.startswith("transformers.")
        for cls in type(processing_class).__mro__
    )


def pick_default_collator(processing_class: Any = None) -> Callable[[list[Any]], Any]:
    """The reference's default: `DataCollatorWithPadding` for a tokenizer / sequence feature extractor,
    else `default_data_collator`."""
    if processing_class is not None and is_padding_processor(processing_class):
        return DataCollatorWithPadding(processing_class)
    return default_data_collator


_TRANSFORMERS_COLLATORS = "transformers.data.data_collator"

# The default collators, ours and transformers' (named, not imported): an example's `label` / `label_ids` batched as
# given, its text values dropped (default_data_collator) or refused by the tokenizer's `pad` (DataCollatorWithPadding).
_DEFAULT_TRANSFORMERS_COLLATORS = frozenset({"default_data_collator", "DefaultDataCollator", "DataCollatorWithPadding"})


def collates_as_a_default(collate_fn: Any) -> bool:
    """Whether `collate_fn` is one of the default collators, the trainer's pick or passed as `data_collator=`:
    then what the first example shows (raw text, text labels, no labels) fails in it as in the trainer's default, and
    is named before training. A user's own collator may map text or add labels, so it is not judged."""
    if collate_fn is default_data_collator or type(collate_fn) is DataCollatorWithPadding:
        return True
    return _is_transformers_collator(collate_fn, _DEFAULT_TRANSFORMERS_COLLATORS)


def _is_transformers_collator(collate_fn: Any, names: frozenset[str]) -> bool:
    """An instance of one of transformers' collator classes, or one of its collator functions, named in `names`."""
    if type(collate_fn).__module__ == _TRANSFORMERS_COLLATORS:  # an instance of one of its collator classes
        return type(collate_fn).__name__ in names
    return (
        getattr(collate_fn, "__module__", None) == _TRANSFORMERS_COLLATORS
        and getattr(collate_fn, "__name__", None) in names
    )


# Collators that only read their examples (no random numbers drawn, no state kept): skipping their calls leaves
# every later batch and the RNG streams as they would be. transformers' are named, not imported (optional there).
_READ_ONLY_TRANSFORMERS_COLLATORS = frozenset(
    {"default_data_collator", "DataCollatorWithPadding", "DataCollatorForTokenClassification", "DataCollatorForSeq2Seq"}
)


def collates_without_side_effects(collate_fn: Any) -> bool:
    """Whether `collate_fn` is known to draw no random numbers and keep no state, so a resume may skip its calls:
    ours, torch's `default_collate`, transformers' padding / default collators, or a column remover around one
    (whose one-off "ignored columns" message then comes with the first batch collated). A user's callable (a
    masking collator, say) is not known, and is called as the reference calls it."""
    from torch.utils.data import default_collate

    if isinstance(collate_fn, RemoveColumnsCollator):
        return collates_without_side_effects(collate_fn.data_collator)
    if collate_fn is default_data_collator or collate_fn is default_collate:
        return True
    if type(collate_fn) is DataCollatorWithPadding:
        return True
    return _is_transformers_collator(collate_fn, _READ_ONLY_TRANSFORMERS_COLLATORS)
