"""The arguments as the reference's integration callbacks see them: the same values in memory, but pickled without
any `*_token` field, so the `training_args.bin` their model-logging switches write never holds a token.

`HF_DVCLIVE_LOG_MODEL` and `WANDB_LOG_MODEL` make the reference's callback build a `transformers.Trainer` on the
arguments it is handed and `save_model` with it, which pickles those arguments, `hub_token` included
(docs/divergences.md, "the token in a tracker's model files"). Handing those callbacks this view keeps the token in
memory (the fake trainer's Hub calls still authenticate) and off disk.
"""

from __future__ import annotations

import copy
import copyreg
import dataclasses
import functools
from typing import Any

_ABSENT = object()


def _token_fields(args: Any) -> tuple[str, ...]:
    """The `*_token` fields of `args` that hold a value (none: the arguments need no view)."""
    names = _token_field_names(type(args))
    return tuple(name for name in names if getattr(args, name, None) is not None)


@functools.cache
def _token_field_names(cls: type) -> tuple[str, ...]:
    if not dataclasses.is_dataclass(cls):
        return ()
    return tuple(field.name for field in dataclasses.fields(cls) if field.name.endswith("_token"))


def _reduce_without_tokens(self: Any, protocol: int) -> tuple:
    """Pickled as the arguments' own class (a loaded file needs nothing of this module), every `*_token` None."""
    names = set(_token_field_names(type(self)))
    state = {name: (None if name in names else value) for name, value in vars(self).items()}
    # copyreg's own rebuilder (what protocols 0 and 1 use): `__newobj__` must name the object's class itself.
    return (copyreg._reconstructor, (type(self).token_free_base, object, None), state)


def _copy_keeping_view(self: Any) -> Any:
    clone = object.__new__(type(self))
    clone.__dict__.update(vars(self))
    return clone


def _deepcopy_keeping_view(self: Any, memo: dict) -> Any:
    clone = object.__new__(type(self))
    memo[id(self)] = clone
    clone.__dict__.update(copy.deepcopy(vars(self), memo))
    return clone


@functools.cache
def _view_class(cls: type) -> type:
    """`cls` with its pickling redacting the tokens; a copy or deep copy stays such a view (the token in memory)."""
    cls = getattr(cls, "token_free_base", cls)  # a view of a view: the same class
    return type(
        cls.__name__,
        (cls,),
        {
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__reduce_ex__": _reduce_without_tokens,
            "__copy__": _copy_keeping_view,
            "__deepcopy__": _deepcopy_keeping_view,
            "token_free_base": cls,
        },
    )


def token_free_pickle(args: Any) -> Any:
    """A shallow view of `args` pickled without its tokens; `args` itself when no `*_token` field holds a value."""
    if not hasattr(args, "__dict__") or not _token_fields(args):
        return args
    view = object.__new__(_view_class(type(args)))
    view.__dict__.update(vars(args))
    return view


def write_back(view: Any, args: Any) -> None:
    """The attributes a callback set on `view` (the reference's WandbCallback clears `run_name` in a search), set
    on `args` too, as when the callback had the arguments themselves; the tokens are the same objects, untouched."""
    if view is args:
        return
    current = vars(args)
    for name, value in vars(view).items():
        if current.get(name, _ABSENT) is not value:
            setattr(args, name, value)
