"""`on_lightning(*classes)`: a library's `Trainer` / `TrainingArguments` subclasses rebuilt over ours, once per process.

Every adapted class has one rebuilt counterpart in the process, named `hf_lightning.adapted.<its module>.<its
name>`: the adapted module (adapted/modules.py imports it by that name) is a copy of the library module's globals in
which each rebuilt class and replaced object is bound under the library's own names. Rebuilt methods run in those
globals, so a pickled `training_args.bin` names an importable class, and `get_type_hints` resolves a dataclass's
string annotations in the module the class says it lives in.

A rebuild takes along what it needs (adapted/discovery.py): the adapted bases, the adapted classes the methods name
and the class attributes hold; classes are rebuilt bases first, then every adapted module's names and every rebuilt
class's class attributes are re-pointed at the rebuilt classes.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

import transformers

from hf_lightning.adapted import accelerate_state
from hf_lightning.adapted.discovery import Discovery, is_replaced
from hf_lightning.adapted.rebuild import ClassRebuilder
from hf_lightning.args.training_args import Seq2SeqTrainingArguments, TrainingArguments
from hf_lightning.trainer.seq2seq import HFLightningSeq2SeqTrainer
from hf_lightning.trainer.trainer import HFLightningTrainer

PREFIX = "hf_lightning.adapted."


def _replacements() -> dict[Any, Any]:
    """The reference's classes -> ours; accelerate's process-global helpers -> stand-ins (adapted/accelerate_state.py)."""
    replaced: dict[Any, Any] = {
        transformers.Trainer: HFLightningTrainer,
        transformers.TrainingArguments: TrainingArguments,
        transformers.Seq2SeqTrainer: HFLightningSeq2SeqTrainer,
        transformers.Seq2SeqTrainingArguments: Seq2SeqTrainingArguments,
    }
    try:
        import accelerate.state
        import accelerate.utils
    except ImportError:  # accelerate is not ours to need; without it nothing refers to it
        return replaced
    replaced[accelerate.utils.set_seed] = accelerate_state.set_seed
    replaced[accelerate.state.AcceleratorState] = accelerate_state.AcceleratorState
    return replaced


_ROOTS = (transformers.Trainer, transformers.TrainingArguments)


class Registry:
    """The process's rebuilt classes and adapted modules."""

    def __init__(self) -> None:
        self.replacements: dict[Any, Any] = _replacements()
        self.modules: dict[str, types.ModuleType] = {}  # library module name -> its adapted module
        self._originals: dict[str, types.ModuleType] = {}
        self._lock = threading.RLock()
        self.discovery = Discovery(lambda: _ROOTS, self.replacements)
        self._rebuilder = ClassRebuilder(self.replacements, lambda name: self.module(name).__dict__)

    # ---- adapted modules ---------------------------------------------------------------------------------
    def module(self, name: str) -> types.ModuleType:
        """The adapted module of library module `name` (created on first use, registered in `sys.modules`)."""
        with self._lock:
            adapted = self.modules.get(name)
            if adapted is None:
                adapted = self._create_module(name)
            return adapted

    def _create_module(self, name: str) -> types.ModuleType:
        original = importlib.import_module(name)
        adapted_name = PREFIX + name
        adapted = types.ModuleType(adapted_name, original.__doc__)
        is_package = hasattr(original, "__path__")
        for key, value in vars(original).items():
            if key in ("__name__", "__spec__", "__loader__", "__path__", "__package__", "__getattr__", "__dir__"):
                continue
            if self.discovery.is_adapted(value):
                continue  # bound once rebuilt (on first use, through __getattr__)
            adapted.__dict__[key] = self._replaced(value)
        adapted.__spec__ = importlib.machinery.ModuleSpec(adapted_name, None, is_package=is_package)
        adapted.__package__ = adapted_name if is_package else adapted_name.rpartition(".")[0]
        if is_package:
            adapted.__path__ = []
        adapted.__getattr__ = self._module_getattr(name)
        adapted.__dir__ = lambda: sorted(set(dir(original)) | set(adapted.__dict__))
        self.modules[name] = adapted
        self._originals[name] = original
        sys.modules[adapted_name] = adapted
        parent, _, child = name.rpartition(".")
        parent_module = self.module(parent) if parent else sys.modules.get(PREFIX.rstrip("."))
        if parent_module is not None:
            setattr(parent_module, child, adapted)
        return adapted

    def _module_getattr(self, name: str) -> Callable[[str], Any]:
        def __getattr__(attribute: str) -> Any:
            value = getattr(self._originals[name], attribute)  # AttributeError as the library's module raises it
            if self.discovery.is_adapted(value):
                return self.adapt([value])[0]
            return self._replaced(value)

        return __getattr__

    def _replaced(self, value: Any) -> Any:
        return self.replacements[value] if is_replaced(value, self.replacements) else value

    # ---- rebuilding --------------------------------------------------------------------------------------
    def adapt(self, classes: list[type]) -> list[type]:
        """Each of `classes` rebuilt (with what it needs), in the order given; ours and rebuilt ones as they are."""
        with self._lock:
            batch = self._batch(classes)
            for cls in sorted(batch, key=lambda c: len(c.__mro__)):  # a base's MRO is shorter than its subclass's
                module = self.module(cls.__module__)
                self.replacements[cls] = self._rebuilder.rebuild(cls, module.__name__)
            if batch:
                self._rebind()
            return [self._replaced(cls) for cls in classes]

    def _batch(self, classes: list[type]) -> list[type]:
        """The classes to rebuild now: `classes` and what they need, not rebuilt before."""
        batch: dict[type, None] = {}
        todo = [cls for cls in classes if self.discovery.is_adapted(cls)]
        while todo:
            cls = todo.pop()
            if cls in batch or is_replaced(cls, self.replacements):
                continue
            batch[cls] = None
            todo.extend(self.discovery.needed_by(cls))
        return list(batch)

    def _rebind(self) -> None:
        """Every adapted module's names and rebuilt class's class attributes re-pointed at the replacements."""
        for name, adapted in self.modules.items():
            for key, value in vars(self._originals[name]).items():
                if is_replaced(value, self.replacements) and key not in ("__getattr__", "__dir__"):
                    adapted.__dict__[key] = self.replacements[value]
        for original, rebuilt in list(self.replacements.items()):
            if not isinstance(original, type) or not (rebuilt.__module__ or "").startswith(PREFIX):
                continue
            for key, value in list(rebuilt.__dict__.items()):
                if is_replaced(value, self.replacements) and isinstance(value, type):
                    setattr(rebuilt, key, self.replacements[value])


REGISTRY = Registry()


def on_lightning(*classes: type) -> Any:
    """The given classes rebuilt over hf_lightning's Trainer / TrainingArguments, returned in the order given (the
    class itself when one is given).

    Each class is a `transformers.Trainer` or `TrainingArguments` subclass, or another library class whose code
    builds one (setfit's `Trainer`). The library's own function code runs; what it delegates to `super()` runs on
    Lightning's engine. The same class given twice, or in two calls, is rebuilt once per process.
    """
    if not classes:
        raise TypeError("on_lightning() takes at least one class, e.g. on_lightning(SentenceTransformerTrainer)")
    for cls in classes:
        if not isinstance(cls, type):
            raise TypeError(f"on_lightning() takes classes; got {cls!r} ({type(cls).__name__})")
        if not (REGISTRY.discovery.is_adapted(cls) or is_replaced(cls, REGISTRY.replacements) or _is_ours(cls)):
            raise TypeError(
                f"on_lightning({cls.__qualname__}): {cls.__module__}.{cls.__qualname__} neither subclasses "
                "transformers.Trainer / TrainingArguments nor builds one in its code; give the library's trainer or "
                "arguments class"
            )
    rebuilt = REGISTRY.adapt(list(classes))
    return rebuilt[0] if len(rebuilt) == 1 else tuple(rebuilt)


def _is_ours(cls: type) -> bool:
    return (cls.__module__ or "").split(".")[0] == "hf_lightning"
