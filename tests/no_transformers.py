"""A preamble for subprocess tests that behave as if transformers and accelerate were not installed.

Both the modules and their package metadata are hidden: libraries such as torchmetrics decide from
the metadata whether to import transformers, exactly as on a machine where it is not installed.
"""

BLOCK_TRANSFORMERS = '''
import importlib.abc, importlib.metadata, sys

_BLOCKED = {"transformers", "accelerate"}

class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

def _hide(function):
    def hidden(name, *args, **kwargs):
        if str(name).split(".")[0].lower() in _BLOCKED:
            raise importlib.metadata.PackageNotFoundError(name)
        return function(name, *args, **kwargs)
    return hidden

sys.meta_path.insert(0, _NotInstalled())
importlib.metadata.version = _hide(importlib.metadata.version)
importlib.metadata.distribution = _hide(importlib.metadata.distribution)
'''
