"""Without trl installed, importing hf_lightning.trl says how to install it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_BLOCK_TRL = '''
import importlib.abc, sys

class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "trl":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
'''


def test_import_without_trl_names_the_extra():
    code = _BLOCK_TRL + "\nimport hf_lightning.trl\n"
    completed = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert completed.returncode != 0
    assert "hf_lightning.trl needs trl, which is not installed" in completed.stderr
    assert 'pip install -e ".[trl]"' in completed.stderr
