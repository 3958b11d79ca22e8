"""The README's "On a Ray cluster" script runs as written: Ray Train on 2 CPU workers, then a Ray Tune search."""

from __future__ import annotations

import pytest

from tests.docs.test_readme_newcomer import python_block
from tests.integrations.ray_cluster import ray_left_as_found

ray = pytest.importorskip("ray", reason="Ray is not installed: `pip install -e \".[ray]\"` runs this test")


@pytest.mark.slow
def test_the_ray_script_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with ray_left_as_found():  # the script's ray.init() changes the process's SIGTERM handler and environment
        exec(compile(python_block("## On a Ray cluster"), "README.md (On a Ray cluster)", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert "Ray Train: 8 " in out and "Ray Tune: {'learning_rate':" in out
    assert (tmp_path / "ray_out" / "train" / "checkpoint-8").is_dir()
    assert len(list((tmp_path / "ray_out" / "search").glob("run-*"))) == 2
