"""Import time of hf_lightning (and, for scale, of what a transformers.Trainer script imports).

Two measures per statement: the wall time of a fresh `python -c STATEMENT` minus that of `python -c pass`
(best of N, pinned like the runners), and the total reported by `python -X importtime`, whose
per-module lines also tell whether transformers was imported and which packages cost the most.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

STATEMENTS = (
    "import hf_lightning",
    "from hf_lightning import Trainer, TrainingArguments",
    "import lightning.pytorch",
    "from transformers import Trainer, TrainingArguments",
)
_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)$")


def _wall(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def parse_importtime(stderr: str) -> dict[str, Any]:
    """Total seconds, whether transformers was imported, and the self time by top-level package."""
    total_us = 0
    by_package: dict[str, int] = defaultdict(int)
    modules = set()
    for line in stderr.splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        self_us, cumulative_us, indent, module = int(match[1]), int(match[2]), match[3], match[4]
        modules.add(module)
        by_package[module.split(".")[0]] += self_us
        if len(indent) == 1:  # a top-level import of the statement
            total_us += cumulative_us
    top = sorted(by_package.items(), key=lambda item: -item[1])[:8]
    return {
        "importtime_s": total_us / 1e6,
        "imports_transformers": "transformers" in modules,
        "imports_lightning": "lightning" in modules,
        "top_packages_s": {name: us / 1e6 for name, us in top},
    }


def measure_imports(
    prefix: list[str], env: dict[str, str], statements: tuple[str, ...] = STATEMENTS, runs: int = 3
) -> dict[str, Any]:
    """Measure each statement; `prefix` is the pinning command (e.g. ["taskset", "-c", "1"])."""
    python = [*prefix, sys.executable]
    baseline = min(_wall([*python, "-c", "pass"], env) for _ in range(runs))
    rows = []
    for statement in statements:
        wall = min(_wall([*python, "-c", statement], env) for _ in range(runs)) - baseline
        profile = subprocess.run(
            [*python, "-X", "importtime", "-c", statement],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        rows.append({"statement": statement, "wall_s": wall, **parse_importtime(profile.stderr)})
    return {"python_startup_s": baseline, "runs": runs, "statements": rows}
