"""benchmarks/trl_sft.py runs end to end at a tiny size: both sides did the same steps and reached the same loss."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_trl_sft_benchmark_smoke(tmp_path):
    out = tmp_path / "trl_sft.json"
    completed = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "trl_sft.py"), "--smoke", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "ours / stock steps/s:" in completed.stdout
    results = json.loads(out.read_text())["results"]
    assert sorted(r["side"] for r in results) == ["ours", "stock"]
    assert {r["global_step"] for r in results} == {12} and all(r["steps"] == 12 for r in results)
    assert results[0]["last_loss"] == pytest.approx(results[1]["last_loss"], rel=1e-5)
