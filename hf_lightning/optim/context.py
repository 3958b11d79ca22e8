"""What every optimizer handler receives (`OptimizerContext`) and how it checks an optional package.

Shared by `optimizers.py` (the handler table and the built-in handlers) and `extras.py` (the handlers for
optional packages), so neither imports the other for it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from typing import Any

from packaging import version
from torch import nn

__all__ = ["MissingOptimizerPackageError", "OptimizerContext", "package_version"]


class MissingOptimizerPackageError(ValueError, ImportError):
    """An `optim` value needs a package that is not installed (ValueError for us, ImportError like the reference)."""


@dataclass
class OptimizerContext:
    """What every handler gets: the arguments, the model, base kwargs, Adam kwargs and parsed optim_args."""

    args: Any
    model: nn.Module | None
    optim: str
    optimizer_kwargs: dict[str, Any]
    adam_kwargs: dict[str, Any]
    optim_args: dict[str, str]

    def require(self, module: str, pip: str, min_version: str | None = None) -> None:
        """Raise MissingOptimizerPackageError unless `module` (at least `min_version`) is importable."""
        # A method of the context so every handler (optimizers.py's and extras.py's) checks its package alike.
        installed = package_version(module)
        if installed is None or (
            min_version is not None and version.parse(installed) < version.parse(min_version)
        ):
            need = f"`{module}`" + (f" >= {min_version}" if min_version else "")
            found = f"version {installed} is installed" if installed is not None else "it is not installed"
            raise MissingOptimizerPackageError(
                f"optim={self.optim!r} needs {need}, but {found}. Install it with `{pip}`, "
                "or choose another `optim` (e.g. 'adamw_torch')."
            )


def package_version(module: str) -> str | None:
    """The installed version of the importable top-level `module` ("0" if unknown), or None if absent."""
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        # Distribution name differs from the module name (e.g. optimi from torch-optimi).
        dists = importlib.metadata.packages_distributions().get(module, [])
        return importlib.metadata.version(dists[0]) if dists else "0"
