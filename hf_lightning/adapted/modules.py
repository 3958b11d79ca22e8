"""The import form: `from hf_lightning.adapted.sentence_transformers import SentenceTransformerTrainer`.

A meta-path finder answers every module name under `hf_lightning.adapted.` that is not one of this package's own
modules: `hf_lightning.adapted.<library module>` is the library module's adapted copy (adapted/registry.py), whose
`Trainer` / `TrainingArguments` subclasses (and the classes whose code builds them) are the rebuilt ones. The finder
sits after Python's own finders, so this package's modules are found first; a pickle naming a rebuilt class
(`training_args.bin`) imports its module by this name in a new process.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

PREFIX = "hf_lightning.adapted."


class AdaptedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and loads `hf_lightning.adapted.<library module>` from the process's registry."""

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(PREFIX):
            return None
        original = fullname[len(PREFIX) :]
        try:
            spec = importlib.util.find_spec(original)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        return importlib.machinery.ModuleSpec(
            fullname, self, is_package=spec.submodule_search_locations is not None
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        # lazy: the registry loads transformers and the engine, only when an adapted module is imported
        from hf_lightning.adapted.registry import REGISTRY

        return REGISTRY.module(spec.name[len(PREFIX) :])

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the adapted module is the library module's globals, its classes rebuilt on first use."""


def install() -> None:
    """Put the finder at the end of `sys.meta_path` (once)."""
    if not any(isinstance(finder, AdaptedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(AdaptedModuleFinder())
