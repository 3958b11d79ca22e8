"""Rebuild one class over new bases from its own function objects (nothing copied as source).

`SFTTrainer(_BaseTrainer(transformers.Trainer))` becomes `SFTTrainer'(_BaseTrainer'(hf_lightning.Trainer))`: every
class is created anew with the same name, metaclass and members, whose functions are the library's code objects
re-created with

- their `__class__` cell pointing at the rebuilt class, so a zero-argument `super()` walks the rebuilt MRO (ours).
  A decorated method (`functools.wraps`, `torch.no_grad()`, a profiling decorator) holds the method one closure
  deeper: the wrapper is re-created around the re-created method, so its `super()` is re-pointed too;
- the globals of an adapted module (`hf_lightning.adapted.<the library's module>`, adapted/modules.py), in which
  every rebuilt class and replaced object is bound under the library's names, so `SFTConfig(...)` or
  `isinstance(args, TrainingArguments)` in the library's code mean the rebuilt classes.

Dataclasses (arguments classes) are re-declared field by field (the same `Field` settings) over the new base and
passed through `dataclasses.dataclass` again, so their fields follow the new base's. ABCs are rebuilt by their own
metaclass, which recomputes the abstract methods (its caches are not shared with the stock class).
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable, Mapping
from typing import Any

# What `dataclasses.dataclass` generates; the rebuilt dataclass gets its own.
_DATACLASS_GENERATED = frozenset(
    {"__init__", "__repr__", "__eq__", "__hash__", "__match_args__", "__dataclass_fields__", "__dataclass_params__"}
)
# Per-class machinery the new class gets from `type()` / its metaclass, never the stock class's objects.
_NEVER_COPIED = frozenset({"__dict__", "__weakref__", "_abc_impl", "__abstractmethods__"})


class ClassRebuilder:
    """Re-creates classes and their functions; `namespace_of(module name)` gives the globals they run in."""

    def __init__(self, replacements: Mapping[Any, Any], namespace_of: Callable[[str], dict[str, Any]]) -> None:
        self.replacements = replacements
        self._namespace_of = namespace_of

    def rebuild(self, cls: type, module: str) -> type:
        """`cls` over its replaced bases with its functions re-created, named `module`.`cls.__qualname__`."""
        bases = tuple(self.replacements.get(base, base) for base in cls.__bases__)
        cell = types.CellType()
        class_cell = _class_cell(cls)
        is_dataclass = "__dataclass_fields__" in cls.__dict__
        namespace: dict[str, Any] = {}
        for name, value in cls.__dict__.items():
            if name in _NEVER_COPIED or (is_dataclass and name in _DATACLASS_GENERATED):
                continue
            if isinstance(value, (types.MemberDescriptorType, types.GetSetDescriptorType)):
                continue  # __slots__ descriptors: `type()` makes the new class's own
            namespace[name] = self.member(value, class_cell, cell)
        if is_dataclass:
            own_annotations = cls.__dict__.get("__annotations__", {})
            for name in own_annotations:
                if name in cls.__dataclass_fields__:
                    namespace[name] = _field_copy(cls.__dataclass_fields__[name])
            namespace["__annotations__"] = dict(own_annotations)
        namespace["__module__"] = module
        namespace["__qualname__"] = cls.__qualname__
        rebuilt = type(cls)(cls.__name__, bases, namespace)
        if is_dataclass:
            params = cls.__dataclass_params__
            # repr=False: the base's redacting __repr__ stays (a generated one would print hub_token).
            rebuilt = dataclasses.dataclass(
                rebuilt, init=params.init, repr=False, eq=params.eq, order=params.order,
                unsafe_hash=params.unsafe_hash, frozen=params.frozen,
            )
        cell.cell_contents = rebuilt
        return rebuilt

    def member(self, value: Any, class_cell: types.CellType | None, cell: types.CellType) -> Any:
        """A class-dict entry with its functions re-created (plain, static, class methods, properties)."""
        if isinstance(value, types.FunctionType):
            return self.function(value, class_cell, cell, value.__globals__)
        if isinstance(value, (staticmethod, classmethod)) and isinstance(value.__func__, types.FunctionType):
            return type(value)(self.function(value.__func__, class_cell, cell, value.__func__.__globals__))
        if isinstance(value, property):
            parts = [self.member(part, class_cell, cell) if part is not None else None
                     for part in (value.fget, value.fset, value.fdel)]
            return property(*parts, doc=value.__doc__)
        if isinstance(value, functools.cached_property) and isinstance(value.func, types.FunctionType):
            return functools.cached_property(self.function(value.func, class_cell, cell, value.func.__globals__))
        return value

    def function(
        self, func: types.FunctionType, class_cell: types.CellType | None, cell: types.CellType,
        module_globals: dict[str, Any],
    ) -> types.FunctionType:
        """`func` re-created: the class's `__class__` cell replaced by `cell` (also inside the functions its closure
        holds, a decorator's wrapped method), and the adapted globals where `func` runs in the class's module."""
        closure = func.__closure__
        if closure is not None:
            closure = tuple(self._cell(c, class_cell, cell, module_globals) for c in closure)
        globals_ = func.__globals__
        if globals_ is module_globals:
            globals_ = self._namespace_of(globals_.get("__name__", func.__module__))
        rebuilt = types.FunctionType(func.__code__, globals_, func.__name__, func.__defaults__, closure)
        rebuilt.__kwdefaults__ = func.__kwdefaults__
        rebuilt.__dict__.update(func.__dict__)
        wrapped = func.__dict__.get("__wrapped__")
        if closure is not None and wrapped is not None:
            # functools.wraps' pointer follows the re-created method it wraps.
            for original, new in zip(func.__closure__, closure):
                if original is not new and _contents(original) is wrapped:
                    rebuilt.__wrapped__ = new.cell_contents
        rebuilt.__qualname__ = func.__qualname__
        rebuilt.__doc__ = func.__doc__
        rebuilt.__module__ = func.__module__
        rebuilt.__annotations__ = func.__annotations__
        rebuilt.__wrapped_original__ = func  # where the code comes from, for readers and tests
        return rebuilt

    def _cell(
        self, original: types.CellType, class_cell: types.CellType | None, cell: types.CellType,
        module_globals: dict[str, Any],
    ) -> types.CellType:
        if class_cell is not None and original is class_cell:
            return cell
        contents = _contents(original)
        if isinstance(contents, types.FunctionType) and _reaches_cell(contents, class_cell):
            return types.CellType(self.function(contents, class_cell, cell, module_globals))
        return original


_EMPTY = object()


def _contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return _EMPTY


def _class_cell(cls: type) -> types.CellType | None:
    """The `__class__` cell the class body gave its methods (shared by all of them); None if no method uses one."""
    for value in cls.__dict__.values():
        for func in _functions_of(value):
            found = _find_class_cell(func, cls, depth=0)
            if found is not None:
                return found
    return None


def _functions_of(value: Any) -> list[types.FunctionType]:
    if isinstance(value, types.FunctionType):
        return [value]
    if isinstance(value, (staticmethod, classmethod)):
        return _functions_of(value.__func__)
    if isinstance(value, property):
        return [f for part in (value.fget, value.fset, value.fdel) for f in _functions_of(part)]
    if isinstance(value, functools.cached_property):
        return _functions_of(value.func)
    return []


def _find_class_cell(func: types.FunctionType, cls: type, depth: int) -> types.CellType | None:
    if func.__closure__ is None or depth > 8:
        return None
    for name, cell in zip(func.__code__.co_freevars, func.__closure__):
        contents = _contents(cell)
        if name == "__class__" and contents is cls:
            return cell
        if isinstance(contents, types.FunctionType):
            found = _find_class_cell(contents, cls, depth + 1)
            if found is not None:
                return found
    return None


def _reaches_cell(func: types.FunctionType, target: types.CellType | None, depth: int = 0) -> bool:
    """Whether `func`'s closure (or that of a function it holds) contains `target`."""
    if target is None or func.__closure__ is None or depth > 8:
        return False
    for cell in func.__closure__:
        if cell is target:
            return True
        contents = _contents(cell)
        if isinstance(contents, types.FunctionType) and _reaches_cell(contents, target, depth + 1):
            return True
    return False


def _field_copy(original: dataclasses.Field) -> Any:
    """A fresh `dataclasses.field` with `original`'s settings."""
    return dataclasses.field(
        default=original.default, default_factory=original.default_factory, init=original.init,
        repr=original.repr, hash=original.hash, compare=original.compare, metadata=original.metadata,
        kw_only=original.kw_only,
    )
