"""Which classes a rebuild takes along: the ones that are, or whose code builds, a replaced class.

A class is adapted when it subclasses a replaced class (`transformers.Trainer`, `TrainingArguments`, ...), or when
it belongs to another library, is no torch module (models and losses stay the library's), and its methods name (as a
global) an adapted class or a replaced object: setfit's `Trainer` is no `transformers.Trainer`, but its `__init__`
builds a sentence-transformers trainer, so it is rebuilt to build ours. What a method names is read from its code objects (`co_names`, nested functions and comprehensions
included), resolved in the method's module globals, as the interpreter would resolve them.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

# Packages whose classes are never rebuilt for what their code names: the replaced libraries and ours.
_NEVER_REBUILT_FOR_REFERENCES = frozenset(
    {"transformers", "accelerate", "torch", "lightning", "pytorch_lightning", "hf_lightning", "builtins", "typing",
     "abc", "dataclasses", "enum", "functools", "collections"}
)


def class_functions(cls: type) -> Iterator[types.FunctionType]:
    """The functions of `cls`'s own dict (plain, static and class methods, property parts), with those their
    closures hold (a decorator's wrapped method)."""
    for value in cls.__dict__.values():
        yield from _functions_in(value)


def _functions_in(value: Any, depth: int = 0) -> Iterator[types.FunctionType]:
    if depth > 8:
        return
    if isinstance(value, (staticmethod, classmethod)):
        yield from _functions_in(value.__func__, depth)
    elif isinstance(value, property):
        for part in (value.fget, value.fset, value.fdel):
            yield from _functions_in(part, depth)
    elif isinstance(value, types.FunctionType):
        yield value
        for cell in value.__closure__ or ():
            try:
                contents = cell.cell_contents
            except ValueError:
                continue
            if isinstance(contents, types.FunctionType):
                yield from _functions_in(contents, depth + 1)
    else:
        func = getattr(value, "func", None)  # functools.cached_property
        if isinstance(func, types.FunctionType):
            yield from _functions_in(func, depth)


def _names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def referenced_globals(func: types.FunctionType) -> Iterator[Any]:
    """The values of the global names `func`'s code reads (names it cannot resolve are skipped)."""
    namespace = func.__globals__
    for name in dict.fromkeys(_names(func.__code__)):
        if name in namespace:
            yield namespace[name]


def is_replaced(value: Any, replacements: Mapping[Any, Any]) -> bool:
    """Whether `value` is a key of `replacements` (unhashable values never are)."""
    if not isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
        return False
    try:
        return value in replacements
    except TypeError:
        return False


class Discovery:
    """`is_adapted(cls)` with its answers cached; `roots` are the replaced classes."""

    def __init__(self, roots: Callable[[], tuple[type, ...]], replacements: Mapping[Any, Any]) -> None:
        self._roots = roots
        self._replacements = replacements
        self._answers: dict[type, bool] = {}

    def is_adapted(self, value: Any) -> bool:
        """Whether `value` is a class to rebuild (see the module docstring); replaced classes and ours are not."""
        if not isinstance(value, type) or is_replaced(value, self._replacements):
            return False
        if value in self._answers:
            return self._answers[value]
        self._answers[value] = False  # a class that (indirectly) names itself is decided by its other names
        answer = self._decide(value)
        self._answers[value] = answer
        return answer

    def forget(self) -> None:
        """Drop cached answers (a rebuild changed what is replaced)."""
        self._answers.clear()

    def _decide(self, cls: type) -> bool:
        package = (cls.__module__ or "").split(".")[0]
        if package == "hf_lightning":
            return False
        if any(issubclass(cls, root) for root in self._roots()):
            return True
        if package in _NEVER_REBUILT_FOR_REFERENCES or issubclass(cls, torch.nn.Module):
            # A model or loss crosses between the library's code and the user's (a stock CrossEncoder given to a
            # stock loss): it stays the library's class, even when a `fit()` of it builds a trainer.
            return False
        if any(self.is_adapted(base) for base in cls.__mro__[1:]):
            return True
        return any(
            is_replaced(value, self._replacements) or self.is_adapted(value)
            for func in class_functions(cls)
            for value in referenced_globals(func)
        )

    def needed_by(self, cls: type) -> Iterator[type]:
        """The classes rebuilding `cls` needs rebuilt as well: its adapted bases, the adapted classes its methods
        name and its class attributes hold (`training_args_class = SentenceTransformerTrainingArguments`)."""
        for base in cls.__mro__[1:]:
            if self.is_adapted(base):
                yield base
        for func in class_functions(cls):
            for value in referenced_globals(func):
                if self.is_adapted(value):
                    yield value
        for value in cls.__dict__.values():
            if self.is_adapted(value):
                yield value
