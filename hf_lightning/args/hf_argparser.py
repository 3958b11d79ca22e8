"""``HfArgumentParser``: the reference's dataclass-driven ``argparse`` parser, without transformers.

A script that swaps ``from transformers import HfArgumentParser, TrainingArguments`` for
``from hf_lightning import HfArgumentParser, TrainingArguments`` keeps its command line: the field ->
argument rules are transformers 5.24's (``transformers/hf_argparser.py``, Apache-2.0). One addition:
for hf_lightning's ``TrainingArguments`` the transformers v4 flag names (``--evaluation_strategy``,
``--warmup_ratio``, ...) are accepted too and handed to the constructor, which folds them into the v5
fields with a ``FutureWarning`` (``hf_lightning.args.hf_argparser_v4``). transformers 5.24 rejects them.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys
import types
from argparse import SUPPRESS, ArgumentDefaultsHelpFormatter, ArgumentParser, ArgumentTypeError
from collections.abc import Callable, Iterable
from enum import Enum
from inspect import isclass
from pathlib import Path
from typing import Any, Literal, NewType, Union, get_type_hints

import yaml  # PyYAML is a dependency of lightning

from hf_lightning.args.hf_argparser_v4 import add_v4_alias_arguments, v4_alias_names

__all__ = [
    "DataClass",
    "DataClassType",
    "HfArg",
    "HfArgumentParser",
    "make_choice_type_function",
    "string_to_bool",
]

DataClass = NewType("DataClass", Any)
DataClassType = NewType("DataClassType", Any)


def string_to_bool(v: str | bool) -> bool:
    """Read a command-line truth value (yes/no, true/false, t/f, y/n, 1/0, any case)."""
    if isinstance(v, bool):
        return v
    if v.lower() in ("yes", "true", "t", "y", "1"):
        return True
    if v.lower() in ("no", "false", "f", "n", "0"):
        return False
    raise ArgumentTypeError(
        f"Truthy value expected: got {v} but expected one of yes/no, true/false, t/f, y/n, 1/0 (case insensitive)."
    )


def make_choice_type_function(choices: Iterable[Any]) -> Callable[[str], Any]:
    """Map each choice's ``str()`` back to the choice, so choices of several types (Literal[1, "a"]) parse."""
    str_to_choice = {str(choice): choice for choice in choices}
    return lambda arg: str_to_choice.get(arg, arg)


def HfArg(  # noqa: N802 - the reference's name
    *,
    aliases: str | list[str] | None = None,
    help: str | None = None,  # noqa: A002 - the reference's keyword
    default: Any = dataclasses.MISSING,
    default_factory: Callable[[], Any] = dataclasses.MISSING,  # type: ignore[assignment]
    metadata: dict | None = None,
    **kwargs: Any,
) -> Any:
    """A ``dataclasses.field`` with ``aliases`` and ``help`` as keywords (stored in the field's metadata).

    Without ``default`` or ``default_factory`` the argument is required on the command line.
    """
    metadata = {} if metadata is None else metadata
    if aliases is not None:
        metadata["aliases"] = aliases
    if help is not None:
        metadata["help"] = help
    return dataclasses.field(metadata=metadata, default=default, default_factory=default_factory, **kwargs)


def _is_union(tp: Any) -> bool:
    origin = getattr(tp, "__origin__", tp)
    return origin is Union or isinstance(origin, types.UnionType)


def _is_bool_type(tp: Any) -> bool:
    return tp is bool or tp == bool | None


def _narrow_union(tp: Any, name: str) -> Any:
    """The one type a ``Union`` field is parsed as, by the reference's rules.

    ``X | None`` -> ``X`` (``bool | None`` is kept: it is a bool flag); a union holding ``str`` keeps its
    other first/second member; any other union is refused, since an argument has one type.
    """
    members = tp.__args__
    if str not in members and (len(members) != 2 or type(None) not in members):
        raise ValueError(
            "Only `Union[X, NoneType]` (i.e., `Optional[X]`) is allowed for `Union` because"
            " the argument parser only supports one type per argument."
            f" Problem encountered in field '{name}'."
        )
    if type(None) not in members:
        return members[0] if members[1] is str else members[1]
    if bool not in members:
        return members[0] if isinstance(None, members[1]) else members[1]
    return tp


def _add_field_argument(
    parser: Any, field: dataclasses.Field, field_type: Any, hide_default: bool = False
) -> None:
    """Add the argument(s) of one dataclass field to ``parser`` (a parser or an argument group).

    ``hide_default`` gives every argument the default ``argparse.SUPPRESS``: the field reaches the
    namespace only when it is on the command line (used for the v4 alias flags).
    """
    # Both `--long_name` and `--long-name`; argparse turns either into the `long_name` destination.
    long_options = [f"--{field.name}"]
    if "_" in field.name:
        long_options.append(f"--{field.name.replace('_', '-')}")

    # Metadata other than "aliases" goes to add_argument as is ("help", "choices", "nargs", ...).
    kwargs = dict(field.metadata)
    aliases = kwargs.pop("aliases", [])
    if isinstance(aliases, str):
        aliases = [aliases]

    if _is_union(field_type):
        field_type = _narrow_union(field_type, field.name)
    origin_type = getattr(field_type, "__origin__", field_type)

    bool_kwargs: dict[str, Any] = {}  # kwargs of the `--no_*` complement of a bool field defaulting to True
    if origin_type is Literal or (isinstance(field_type, type) and issubclass(field_type, Enum)):
        # Enum fields parse to the member's *value* (the dataclass converts it, if it wants to).
        kwargs["choices"] = field_type.__args__ if origin_type is Literal else [x.value for x in field_type]
        kwargs["type"] = make_choice_type_function(kwargs["choices"])
        if field.default is not dataclasses.MISSING:
            kwargs["default"] = field.default
        else:
            kwargs["required"] = True
    elif _is_bool_type(field_type):
        bool_kwargs = dict(kwargs)
        kwargs["type"] = string_to_bool  # argparse's type=bool would read "False" as True
        if field_type is bool or (field.default is not None and field.default is not dataclasses.MISSING):
            # `--flag` alone means True, `--flag false` reads the value; absent: the default (False if none).
            kwargs["default"] = False if field.default is dataclasses.MISSING else field.default
            kwargs["nargs"] = "?"
            kwargs["const"] = True
    elif isclass(origin_type) and issubclass(origin_type, list):
        kwargs["type"] = field_type.__args__[0]
        kwargs["nargs"] = "+"
        if field.default_factory is not dataclasses.MISSING:
            kwargs["default"] = field.default_factory()
        elif field.default is dataclasses.MISSING:
            kwargs["required"] = True
    else:
        kwargs["type"] = field_type
        if field.default is not dataclasses.MISSING:
            kwargs["default"] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            kwargs["default"] = field.default_factory()
        else:
            kwargs["required"] = True
    if hide_default:
        kwargs["default"] = SUPPRESS
    parser.add_argument(*long_options, *aliases, **kwargs)

    # The `--no_*` complement must come after the flag: both write the same destination.
    if field.default is True and _is_bool_type(field_type):
        bool_kwargs["default"] = SUPPRESS if hide_default else False
        parser.add_argument(
            f"--no_{field.name}",
            f"--no-{field.name.replace('_', '-')}",
            action="store_false",
            dest=field.name,
            **bool_kwargs,
        )


def _type_hints(dtype: type) -> dict[str, Any]:
    try:
        return get_type_hints(dtype)
    except NameError as err:
        raise RuntimeError(
            f"Type resolution failed for {dtype}. Try declaring the class in global scope or "
            "removing line of `from __future__ import annotations` which opts in Postponed "
            "Evaluation of Annotations (PEP 563)"
        ) from err


def _takes_v4_aliases(dtype: Any) -> bool:
    """Whether ``dtype`` is hf_lightning's ``TrainingArguments`` (or a subclass) with a v4-folding constructor.

    A user's ``@dataclass`` subclass gets a plain generated ``__init__`` (no ``with_v4_aliases`` wrapper),
    which would reject the v4 keywords, so it gets no v4 flags.
    """
    args_module = sys.modules.get("hf_lightning.args.training_args")  # loaded whenever such a class exists
    return (
        args_module is not None
        and isclass(dtype)
        and issubclass(dtype, args_module.TrainingArguments)
        and hasattr(dtype.__init__, "__wrapped__")
    )


def _init_keys(dtype: Any) -> set[str]:
    """Keywords the parser may pass to ``dtype(...)``: its init fields, plus the v4 names for our arguments."""
    keys = {f.name for f in dataclasses.fields(dtype) if f.init}
    if _takes_v4_aliases(dtype):
        keys |= v4_alias_names()
    return keys


class HfArgumentParser(ArgumentParser):
    """An ``argparse.ArgumentParser`` whose arguments come from the fields of dataclasses (transformers' rules).

    Arguments added after construction come back as one extra ``Namespace`` after the dataclasses.
    A dataclass with an ``_argument_group_name`` attribute gets its own help group.
    """

    dataclass_types: list[DataClassType]

    def __init__(
        self, dataclass_types: DataClassType | Iterable[DataClassType] | None = None, **kwargs: Any
    ) -> None:
        if dataclass_types is None:
            dataclass_types = []
        elif not isinstance(dataclass_types, Iterable):
            dataclass_types = [dataclass_types]
        kwargs.setdefault("formatter_class", ArgumentDefaultsHelpFormatter)  # show defaults in --help
        super().__init__(**kwargs)
        self.dataclass_types = list(dataclass_types)
        for dtype in self.dataclass_types:
            self._add_dataclass_arguments(dtype)

    @staticmethod
    def _parse_dataclass_field(parser: ArgumentParser, field: dataclasses.Field) -> None:
        """Add one field whose ``type`` is already resolved (the reference's static hook)."""
        if isinstance(field.type, str):
            raise RuntimeError(
                "Unresolved type detected, which should have been done with the help of "
                "`typing.get_type_hints` method by default"
            )
        _add_field_argument(parser, field, field.type)

    def _add_dataclass_arguments(self, dtype: DataClassType) -> None:
        parser = (
            self.add_argument_group(dtype._argument_group_name)
            if hasattr(dtype, "_argument_group_name")
            else self
        )
        type_hints = _type_hints(dtype)
        for field in dataclasses.fields(dtype):
            if field.init:
                # Through the overridable hook, as the reference; on a copy, so the class's Field objects are
                # left untouched (the reference assigns `field.type` on the class's own Field).
                resolved = copy.copy(field)
                resolved.type = type_hints[field.name]
                self._parse_dataclass_field(parser, resolved)
        if _takes_v4_aliases(dtype):
            add_v4_alias_arguments(
                self, lambda group, f, tp: _add_field_argument(group, f, tp, hide_default=True)
            )

    def parse_args_into_dataclasses(
        self,
        args: list[str] | None = None,
        return_remaining_strings: bool = False,
        look_for_args_file: bool = True,
        args_filename: str | os.PathLike | None = None,
        args_file_flag: str | None = None,
    ) -> tuple[Any, ...]:
        """Parse ``args`` (default ``sys.argv[1:]``) into one instance per dataclass, in constructor order.

        Arguments from ``.args`` files come first, so the command line wins: ``args_filename``, else
        (``look_for_args_file``) ``<script>.args`` next to ``sys.argv[0]``, then each file named by
        ``args_file_flag`` on the command line (last wins). An extra ``Namespace`` follows when
        arguments were added by hand; unknown strings are returned last with
        ``return_remaining_strings``, else they raise ``ValueError``.
        """
        if args_file_flag or args_filename or (look_for_args_file and len(sys.argv)):
            args_files: list[Path] = []
            if args_filename:
                args_files.append(Path(args_filename))
            elif look_for_args_file and len(sys.argv):
                args_files.append(Path(sys.argv[0]).with_suffix(".args"))
            if args_file_flag:
                # A throwaway parser pulls the file flags out; the rest of the strings are parsed below.
                args_file_parser = ArgumentParser()
                args_file_parser.add_argument(args_file_flag, type=str, action="append")
                cfg, args = args_file_parser.parse_known_args(args=args)
                cmd_args_file_paths = vars(cfg).get(args_file_flag.lstrip("-"), None)
                if cmd_args_file_paths:
                    args_files.extend(Path(p) for p in cmd_args_file_paths)
            file_args: list[str] = []
            for args_file in args_files:
                if args_file.exists():
                    file_args += args_file.read_text().split()
            args = file_args + args if args is not None else file_args + sys.argv[1:]

        namespace, remaining_args = self.parse_known_args(args=args)
        outputs: list[Any] = []
        for dtype in self.dataclass_types:
            keys = _init_keys(dtype)
            inputs = {k: v for k, v in vars(namespace).items() if k in keys}
            for k in inputs:
                delattr(namespace, k)
            if _takes_v4_aliases(dtype) and not v4_alias_names().isdisjoint(inputs):
                # The constructor reads a v5 keyword next to its v4 alias as a conflict, so pass only the
                # fields the user gave; the others keep their dataclass defaults (= the argparse defaults).
                given = self._given_destinations(args)
                inputs = {k: v for k, v in inputs.items() if k in given}
            outputs.append(dtype(**inputs))
        if len(namespace.__dict__) > 0:
            outputs.append(namespace)
        if return_remaining_strings:
            return (*outputs, remaining_args)
        if remaining_args:
            raise ValueError(
                f"Some specified arguments are not used by the HfArgumentParser: {remaining_args}"
            )
        return tuple(outputs)

    def _given_destinations(self, args: list[str] | None) -> set[str]:
        """Destinations that ``args`` sets (a re-parse with every default suppressed)."""
        saved = [(action, action.default) for action in self._actions]
        try:
            for action, _ in saved:
                action.default = SUPPRESS
            namespace, _ = self.parse_known_args(args=args)
        finally:
            for action, default in saved:
                action.default = default
        return set(vars(namespace))

    def parse_dict(self, args: dict[str, Any], allow_extra_keys: bool = False) -> tuple[Any, ...]:
        """Build the dataclasses from a dict, without argparse (no type conversion, no choices check).

        Keys that no dataclass takes raise ``ValueError`` unless ``allow_extra_keys``.
        """
        unused_keys = set(args.keys())
        outputs = []
        for dtype in self.dataclass_types:
            keys = _init_keys(dtype)
            inputs = {k: v for k, v in args.items() if k in keys}
            unused_keys.difference_update(inputs.keys())
            outputs.append(dtype(**inputs))
        if not allow_extra_keys and unused_keys:
            raise ValueError(f"Some keys are not used by the HfArgumentParser: {sorted(unused_keys)}")
        return tuple(outputs)

    def parse_json_file(
        self, json_file: str | os.PathLike, allow_extra_keys: bool = False
    ) -> tuple[Any, ...]:
        """``parse_dict`` of a JSON file's object."""
        with open(Path(json_file), encoding="utf-8") as f:
            data = json.loads(f.read())
        return self.parse_dict(data, allow_extra_keys=allow_extra_keys)

    def parse_yaml_file(
        self, yaml_file: str | os.PathLike, allow_extra_keys: bool = False
    ) -> tuple[Any, ...]:
        """``parse_dict`` of a YAML file's mapping (``yaml.safe_load``)."""
        data = yaml.safe_load(Path(yaml_file).read_text(encoding="utf-8"))
        return self.parse_dict(data, allow_extra_keys=allow_extra_keys)
