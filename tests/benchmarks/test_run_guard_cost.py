"""benchmarks/run_guard_cost.py runs at the smoke scale and writes one on/off ratio per action and workload."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks import run_guard_cost  # noqa: E402


def test_the_benchmark_runs_at_the_smoke_scale(tmp_path):
    out = tmp_path / "cost.json"
    assert run_guard_cost.main(["--workloads", "tiny", "--scale", "smoke", "--pairs", "1", "--out", str(out)]) == 0
    (result,) = json.loads(out.read_text())["results"]
    for action in run_guard_cost.ACTIONS:
        assert result[action]["pair_ratio"] > 0 and result[action]["off_cpu_ms_per_step"] > 0
