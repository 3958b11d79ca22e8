"""Keywords a class takes through `**kwargs` but its signature does not show, passed on from a run config.

A transformers config class (`BertConfig(num_labels=2, problem_type=..., id2label=...)`) accepts keywords in
Python that its signature does not list: they reach `PreTrainedConfig` through `**kwargs`. jsonargparse builds its
parser from the signature, so it would refuse `num_labels` under `init_args`. jsonargparse's own place for such
keywords is `dict_kwargs` (given to the class as they are, so the class itself checks them); this module moves
them there, in config files and in dotted command-line overrides, before jsonargparse parses. Keywords the
signature shows stay in `init_args`, where jsonargparse checks their types.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

# Base classes whose constructors accept any keyword (stored on the instance or checked by the class itself).
OPEN_KEYWORD_BASES = frozenset({"PreTrainedConfig", "PretrainedConfig"})
CONFIG_OPTIONS = ("--config", "-c")
INIT_ARGS = ".init_args."
# Optional packages a config may name classes of, with the command that installs each from a checkout.
OPTIONAL_PACKAGES = {"transformers": 'pip install -e ".[transformers]"'}


class MissingPackageError(ImportError):
    """A config names a class of an optional package that is not installed; the message says how to install it."""


def import_class(class_path: str) -> type | None:
    """The class `class_path` names, or None when it does not import (jsonargparse then reports it)."""
    module_name, _, name = class_path.rpartition(".")
    if not module_name:
        return None
    try:
        value = getattr(importlib.import_module(module_name), name, None)
    except ImportError:
        package = class_path.split(".")[0]
        if package in OPTIONAL_PACKAGES and not _installed(package):
            raise MissingPackageError(
                f"{class_path} needs {package}, which is not installed: {OPTIONAL_PACKAGES[package]} "
                f"(or pip install {package})"
            ) from None
        return None
    return value if inspect.isclass(value) else None


def signature_keywords(cls: type) -> set[str] | None:
    """The keywords `cls` shows in its signature when it accepts others too; None when it takes only those."""
    if not any(
        base.__name__ in OPEN_KEYWORD_BASES and base.__module__.startswith("transformers.")
        for base in cls.__mro__
    ):
        return None
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return None
    return {p.name for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def route_config(
    config: Any,
    keywords_of: Callable[[str], set[str] | None],
    warn: Callable[[str], None] | None = None,
) -> bool:
    """Move, in place, `init_args` keys that a class's signature lacks into its `dict_kwargs`; True if any moved.

    `warn` receives a line for each moved key the class does not define (`unknown_key_warning`).
    """
    moved = False
    for node in _mappings(config):
        init_args = node.get("init_args")
        if not isinstance(node.get("class_path"), str) or not isinstance(init_args, dict):
            continue
        known = keywords_of(node["class_path"])
        if known is None:
            continue
        extra = {key: init_args.pop(key) for key in list(init_args) if key not in known}
        for key in extra if warn is not None else ():
            message = unknown_key_warning(node["class_path"], key)
            if message is not None:
                warn(message)
        if extra:
            node["dict_kwargs"] = {**(node.get("dict_kwargs") or {}), **extra}
            moved = True
    return moved


def route_argv(
    argv: list[str],
    keywords_of: Callable[[str], set[str] | None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> list[str]:
    """`argv` with extra keywords moved to `dict_kwargs`: in `--config` files and in `--X.init_args.KEY` options.

    Raises MissingPackageError when a named class belongs to an optional package that is not installed. `warn`
    receives a line for each moved key the class does not define (a typo such as `num_hiden_layers`).
    """
    import yaml

    keywords_of = keywords_of or _keywords_of_class_path
    classes: dict[str, str] = {}  # option path ("model.init_args.config") -> class_path, as far as known
    routed: list[str] = []
    index = 0
    while index < len(argv):
        token = argv[index]
        option, has_inline, inline = token.partition("=")
        value_index = None if has_inline else index + 1
        value = inline if has_inline else (argv[index + 1] if index + 1 < len(argv) else None)
        if option in CONFIG_OPTIONS and value is not None:
            config = load_config(value)
            if isinstance(config, dict):
                _record_classes(config, "", classes)
                if route_config(config, keywords_of, warn):
                    value = yaml.safe_dump(config, sort_keys=False)
            routed.extend([option, value] if value_index is not None else [f"{option}={value}"])
            index += 2 if value_index is not None else 1
            continue
        if option.startswith("--") and value is not None:
            path = option[2:]
            long_path = _long_form(path, classes)
            option = _routed_option(long_path, classes, keywords_of)
            if option == f"--{long_path}":
                option = f"--{path}"  # not moved: jsonargparse reads it, and names it, as the user wrote it
            if warn is not None and ".dict_kwargs." in option and ".dict_kwargs." not in path:
                prefix, _, key = long_path.rpartition(INIT_ARGS)
                message = unknown_key_warning(classes[prefix], key)
                if message is not None:
                    warn(message)
            if isinstance(value, str) and not value.startswith("-"):
                _record_value(long_path, value, classes)
        routed.append(f"{option}={inline}" if has_inline else option)
        index += 1
    for class_path in classes.values():
        import_class(
            class_path
        )  # raises MissingPackageError for a class of an optional package not installed
    return routed


def _long_form(path: str, classes: Mapping[str, str]) -> str:
    """The `init_args` form of an option path in jsonargparse's short form, as far as the specs on the way are known.

    jsonargparse reads `--model.config.num_labels` as `--model.init_args.config.init_args.num_labels`: inside a
    class spec, a key is one of its `init_args`. A path already in the long form, or one through no known spec,
    comes back as it is.
    """
    parts = path.split(".")
    long_path = parts[0]
    for part in parts[1:]:
        inside_spec = long_path in classes and part not in ("init_args", "class_path", "dict_kwargs", "help")
        long_path = f"{long_path}.init_args.{part}" if inside_spec else f"{long_path}.{part}"
    return long_path


def _routed_option(
    path: str, classes: Mapping[str, str], keywords_of: Callable[[str], set[str] | None]
) -> str:
    """`--P.dict_kwargs.KEY` for `--P.init_args.KEY` when the class at P takes KEY only through **kwargs."""
    prefix, found, key = path.rpartition(INIT_ARGS)
    if not found or "." in key or prefix not in classes:
        return f"--{path}"
    known = keywords_of(classes[prefix])
    if known is None or key in known:
        return f"--{path}"
    return f"--{prefix}.dict_kwargs.{key}"


def _record_value(path: str, value: str, classes: dict[str, str]) -> None:
    """Remember the class a command-line value names for the option path (a class path, or a JSON/YAML spec)."""
    if path.endswith(".class_path"):
        classes[path[: -len(".class_path")]] = value
    elif value.lstrip().startswith("{"):
        config = load_config(value)
        if isinstance(config, dict):
            _record_classes(config, path, classes)
    elif "." in value and " " not in value and not os.path.exists(value):
        classes[path] = value


def _record_classes(config: Any, prefix: str, classes: dict[str, str]) -> None:
    """Record the class_path of every spec in `config` under its dotted option path."""
    if not isinstance(config, dict):
        return
    if isinstance(config.get("class_path"), str) and prefix:
        classes[prefix] = config["class_path"]
    for key, value in config.items():
        child = f"{prefix}.{key}" if prefix else str(key)
        if key == "init_args" and isinstance(value, dict):
            for name, item in value.items():
                _record_classes(item, f"{prefix}.init_args.{name}", classes)
        elif key not in ("class_path", "dict_kwargs"):
            _record_classes(value, child, classes)


def _mappings(config: Any) -> Iterator[dict]:
    """Every dict inside `config`, outermost first."""
    if isinstance(config, dict):
        yield config
        for value in config.values():
            yield from _mappings(value)
    elif isinstance(config, list):
        for value in config:
            yield from _mappings(value)


def load_config(value: str) -> Any:
    """A `--config` value: a YAML / JSON file, or the config text itself (as jsonargparse takes it)."""
    import yaml

    try:
        if os.path.isfile(value):
            with open(value) as handle:
                return yaml.safe_load(handle)
        return yaml.safe_load(value)
    except (OSError, yaml.YAMLError):
        return None  # jsonargparse reports the unreadable config itself


def _installed(package: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(package) is not None
    except ImportError:
        return False


def _keywords_of_class_path(class_path: str) -> set[str] | None:
    cls = import_class(class_path)
    return None if cls is None else signature_keywords(cls)


# Keywords a transformers config takes in `__init__` and consumes without a field or attribute of that name
# (configuration_utils.PreTrainedConfig.__post_init__ pops them; legacy RoPE keys are converted).
_CONSUMED_CONFIG_KEYWORDS = frozenset(
    {
        "torch_dtype", "name_or_path", "_commit_hash", "output_attentions", "attn_implementation",
        "experts_implementation", "per_layer_config", "rope_scaling", "rope_theta",
    }
)  # fmt: skip


def defined_keywords(cls: type) -> set[str]:
    """What a config class defines: its signature's keywords, its attributes and properties (`num_labels`), its
    `attribute_map` aliases, the keywords its constructor consumes, and the generation parameters it drops."""
    defined = set(signature_keywords(cls) or ()) | {name for name in dir(cls) if not name.startswith("__")}
    defined |= set(getattr(cls, "attribute_map", None) or {}) | _CONSUMED_CONFIG_KEYWORDS
    try:
        from transformers import GenerationConfig

        defined |= set(GenerationConfig._get_default_generation_params())
    except (ImportError, AttributeError):
        pass
    return defined


def unknown_key_warning(class_path: str, key: str) -> str | None:
    """A warning for `key` given to the config class at `class_path` when the class does not define it (it would be
    stored as an extra attribute the model never reads), with the closest defined name; None when it is defined."""
    import difflib

    cls = import_class(class_path)
    if cls is None or signature_keywords(cls) is None:
        return None
    defined = defined_keywords(cls)
    if key in defined:
        return None
    close = difflib.get_close_matches(key, sorted(name for name in defined if not name.startswith("_")), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else " (remove it if it is a typo)"
    return (
        f"{cls.__name__} does not define {key!r}: it is stored as an extra attribute, which the model's code does "
        f"not read{hint}"
    )

