"""Before training, the model config takes the tokenizer's PAD / BOS / EOS ids, as the reference's `train()` does.

A tokenizer may define special tokens the model config lacks (a pad token added for fine-tuning, an end-of-turn
EOS): the reference copies them into `model.config` and `model.generation_config`, so the saved `config.json` and
generation use them. We call transformers' own rule (`align_special_tokens`) for transformers' processing classes;
without transformers there is no such tokenizer and nothing to align.
"""

from __future__ import annotations

import sys
from typing import Any


def align_special_tokens(model: Any, processing_class: Any) -> None:
    """Align `model`'s config with `processing_class`'s special-token ids when it is a transformers tokenizer or
    processor and the model has a config (the installed transformers' rule; a version without it aligns nothing)."""
    if sys.modules.get("transformers") is None or processing_class is None or not hasattr(model, "config"):
        return
    from transformers import PreTrainedTokenizerBase, ProcessorMixin, trainer_utils

    if not isinstance(processing_class, (PreTrainedTokenizerBase, ProcessorMixin)):
        return
    align = getattr(trainer_utils, "align_special_tokens", None)
    if align is not None:
        align(model, processing_class)
