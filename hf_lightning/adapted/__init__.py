"""Other libraries' `transformers.Trainer` subclasses on hf_lightning's engine.

`hf_lightning.on_lightning(SentenceTransformerTrainer)` returns the library's class rebuilt over our Trainer
(adapted/registry.py); `from hf_lightning.adapted.sentence_transformers import SentenceTransformerTrainer` is the
same class through an import (adapted/modules.py). The library's own code runs; what it delegates to `super()` runs
on Lightning's `fit`.
"""

from __future__ import annotations

from hf_lightning.adapted.modules import install

install()
