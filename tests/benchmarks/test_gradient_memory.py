"""The gradient-memory benchmark runs its three variants, each in its own process, and reports every figure."""

import json

from benchmarks import gradient_memory


def test_the_benchmark_reports_each_variant(tmp_path, capsys):
    out = tmp_path / "figures.json"

    assert gradient_memory.main(["--repeats", "1", "--steps", "3", "--out", str(out)]) == 0

    figures = json.loads(out.read_text())
    assert set(figures["summary"]) == set(gradient_memory.VARIANTS)
    for variant in gradient_memory.VARIANTS:
        assert figures["summary"][variant]["cpu_ms_per_step"] > 0
        assert figures["summary"][variant]["minor_faults_per_step"] >= 0
    assert len(figures["held_over_freed"]) == 1
    assert "held / freed CPU ms per step" in capsys.readouterr().out
