"""The package version, importable from any layer (`hf_lightning.__version__` re-exports it)."""

__version__ = "0.1.0"
