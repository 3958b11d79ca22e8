"""Rebuild a library's class hierarchy over new bases, re-using its function objects' code.

A TRL trainer is `SFTTrainer(_BaseTrainer(transformers.Trainer))`. `rebuild_classes` makes
`SFTTrainer'(_BaseTrainer'(hf_lightning.Trainer))`: every class of the chain is created anew with the same
name and the same methods, whose code objects are TRL's own (nothing is copied as source). Each method is
re-created from its code object with

- its `__class__` cell pointing at the rebuilt class, so a zero-argument `super()` inside TRL's code walks the
  rebuilt MRO (ours) instead of TRL's;
- a copy of its module's globals in which every class that was rebuilt (and each base that was replaced) is
  bound to its replacement, so `SFTConfig(...)` or `isinstance(args, TrainingArguments)` in TRL's code mean
  the rebuilt classes.

Dataclasses (the configs) are re-declared field by field (the same `Field` settings) over the new base and
passed through `dataclasses.dataclass` again, so their fields follow the new base's and `__init__` accepts
every one of them.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterable, Mapping
from typing import Any

# What `dataclasses.dataclass` generates; the rebuilt dataclass gets its own.
_DATACLASS_GENERATED = frozenset(
    {"__init__", "__repr__", "__eq__", "__hash__", "__match_args__", "__dataclass_fields__", "__dataclass_params__"}
)
_NEVER_COPIED = frozenset({"__dict__", "__weakref__"})


class _Rebuilder:
    """One rebuild: the replacement map and the copied module globals it shares between classes."""

    def __init__(self, replacements: Mapping[Any, Any], module: str) -> None:
        self.replacements: dict[Any, Any] = dict(replacements)
        self.module = module
        self._globals: dict[int, dict[str, Any]] = {}

    def globals_for(self, original: dict[str, Any]) -> dict[str, Any]:
        """The copy of a module's globals that rebuilt functions run in (one copy per module)."""
        copied = self._globals.get(id(original))
        if copied is None:
            copied = dict(original)
            self._globals[id(original)] = copied
        return copied

    def rebind_globals(self) -> None:
        """Bind every replaced class, under every name a copied module knows it by, to its replacement."""
        for copied in self._globals.values():
            for name, value in list(copied.items()):
                if isinstance(value, (type, types.FunctionType)) and value in self.replacements:
                    copied[name] = self.replacements[value]

    def function(self, func: types.FunctionType, cell: types.CellType) -> types.FunctionType:
        """`func`'s code in the copied globals, with its `__class__` cell (if any) replaced by `cell`."""
        closure = func.__closure__
        if closure is not None and "__class__" in func.__code__.co_freevars:
            index = func.__code__.co_freevars.index("__class__")
            closure = closure[:index] + (cell,) + closure[index + 1 :]
        rebuilt = types.FunctionType(
            func.__code__, self.globals_for(func.__globals__), func.__name__, func.__defaults__, closure
        )
        rebuilt.__kwdefaults__ = func.__kwdefaults__
        rebuilt.__dict__.update(func.__dict__)
        rebuilt.__qualname__ = func.__qualname__
        rebuilt.__doc__ = func.__doc__
        rebuilt.__module__ = func.__module__
        rebuilt.__annotations__ = func.__annotations__
        rebuilt.__wrapped_original__ = func  # where the code comes from, for readers and tests
        return rebuilt

    def member(self, value: Any, cell: types.CellType) -> Any:
        """A class-dict entry with its functions rebuilt (plain, static, class methods and properties)."""
        if isinstance(value, types.FunctionType):
            return self.function(value, cell)
        if isinstance(value, staticmethod) and isinstance(value.__func__, types.FunctionType):
            return staticmethod(self.function(value.__func__, cell))
        if isinstance(value, classmethod) and isinstance(value.__func__, types.FunctionType):
            return classmethod(self.function(value.__func__, cell))
        if isinstance(value, property):
            parts = [self.member(part, cell) if part is not None else None for part in (value.fget, value.fset, value.fdel)]
            return property(*parts, doc=value.__doc__)
        return value

    def rebuild(self, cls: type) -> type:
        """`cls` over its replaced bases, with its methods rebuilt; registered as `cls`'s replacement."""
        bases = tuple(self.replacements.get(base, base) for base in cls.__bases__)
        cell = types.CellType()
        is_dataclass = "__dataclass_fields__" in cls.__dict__
        namespace: dict[str, Any] = {}
        for name, value in cls.__dict__.items():
            if name in _NEVER_COPIED or (is_dataclass and name in _DATACLASS_GENERATED):
                continue
            namespace[name] = self.member(value, cell)
        if is_dataclass:
            own_annotations = cls.__dict__.get("__annotations__", {})
            for name in own_annotations:
                namespace[name] = _field_copy(cls.__dataclass_fields__[name])
            namespace["__annotations__"] = dict(own_annotations)
        namespace["__module__"] = self.module
        rebuilt = type(cls)(cls.__name__, bases, namespace)
        if is_dataclass:
            params = cls.__dataclass_params__
            # repr=False: the base's redacting __repr__ stays (a generated one would print hub_token).
            rebuilt = dataclasses.dataclass(
                rebuilt, init=params.init, repr=False, eq=params.eq, order=params.order,
                unsafe_hash=params.unsafe_hash, frozen=params.frozen,
            )
        cell.cell_contents = rebuilt
        self.replacements[cls] = rebuilt
        return rebuilt


def _field_copy(original: dataclasses.Field) -> Any:
    """A fresh `dataclasses.field` with `original`'s settings."""
    return dataclasses.field(
        default=original.default, default_factory=original.default_factory, init=original.init,
        repr=original.repr, hash=original.hash, compare=original.compare, metadata=original.metadata,
        kw_only=original.kw_only,
    )


def rebuild_classes(
    classes: Iterable[type], replacements: Mapping[Any, Any], module: str
) -> dict[str, type]:
    """Rebuild `classes` (each after the bases it needs) with `replacements` for their bases; name -> class.

    `replacements` maps classes (bases, and names the methods' globals bind) and module-level functions the
    methods call to what the rebuilt methods see instead.

    `classes` lists every class of the chains to rebuild, from the class just above a replaced base down to the
    public class, e.g. `[_BaseTrainer, SFTTrainer]` with `{transformers.Trainer: hf_lightning.Trainer}`."""
    rebuilder = _Rebuilder(replacements, module)
    built: dict[str, type] = {}
    for cls in classes:
        missing = [base for base in cls.__bases__ if _needs_rebuild(base, rebuilder.replacements)]
        if missing:
            raise TypeError(f"{cls.__name__}: rebuild its base {missing[0].__name__} first (list it earlier)")
        built[cls.__name__] = rebuilder.rebuild(cls)
    rebuilder.rebind_globals()
    return built


def _needs_rebuild(base: type, replacements: Mapping[Any, Any]) -> bool:
    """Whether `base` derives from a replaced class but was not rebuilt itself."""
    if base in replacements:
        return False
    return any(isinstance(original, type) and issubclass(base, original) for original in replacements)
