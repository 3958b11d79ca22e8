"""A config naming a transformers class, run where transformers is not installed: one line saying how to install it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.no_transformers import BLOCK_TRANSFORMERS

ROOT = Path(__file__).resolve().parents[2]


def test_a_transformers_class_without_transformers_names_the_install_command():
    script = BLOCK_TRANSFORMERS + textwrap.dedent(
        """
        from hf_lightning.cli.main import main
        sys.argv = ["hf-lightning", "validate", "--config", "examples/cls.yaml"]
        sys.exit(main())
        """
    )
    completed = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert completed.returncode == 2, completed.stderr[-3000:]
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in completed.stderr, completed.stderr[-3000:]
    assert lines[0].startswith("hf-lightning validate: error:")
    assert "transformers.BertForSequenceClassification" in lines[0]
    assert 'pip install -e ".[transformers]"' in lines[0]
