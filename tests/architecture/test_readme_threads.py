"""The README's CLI examples run tiny models on one CPU thread, as the main job does (`--num-threads 1`)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_cli_example_sets_one_thread():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    commands = [
        line
        for block in blocks
        for line in block.splitlines()
        if re.search(r"hf-lightning (fit|validate|test|predict) ", line)
    ]
    assert len(commands) >= 4
    for command in commands:
        assert command.startswith("OMP_NUM_THREADS=1 hf-lightning "), command
