"""Under several processes only the main process reports, as in the reference: transformers.Trainer and ours train
the shared tracker run on two processes (gloo, `torchrun`) with `report_to=["tensorboard", "dvclive"]`, each rank in a
working directory of its own (tests/distributed/tracker_script.py). Exactly one run is recorded per tracker, with the
reference's keys and series, and rank 1 opens no writer and writes nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed.launching import side_by_side
from tests.integrations.test_tracker_parity import _assert_same_series

pytestmark = pytest.mark.slow  # two 2-process launches

SCRIPT = Path(__file__).resolve().parents[1] / "distributed" / "tracker_script.py"


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[str, list[dict]]:
    return side_by_side(SCRIPT, tmp_path_factory.mktemp("tracker_processes"), timeout=600)


@pytest.mark.parametrize("side", ["reference", "ours"])
def test_only_the_main_process_reports(ranks, side):
    main, other = ranks[side]
    assert main["tensorboard_writer"] and main["dvclive_live"]
    assert not other["tensorboard_writer"] and not other["dvclive_live"]
    assert other["files_in_cwd"] == []
    assert any(path.startswith("dvclive/") for path in main["files_in_cwd"])
    assert main["network_attempts"] == [] and other["network_attempts"] == []


@pytest.mark.parametrize("tracker", ["tensorboard", "dvclive"])
def test_the_one_run_recorded_is_the_reference_s(ranks, tracker):
    # read_tensorboard asserts one events folder under the side's root: one run, from one process.
    reference, ours = ranks["reference"][0][tracker], ranks["ours"][0][tracker]
    assert any("loss" in key for key in reference["metrics"])
    _assert_same_series(ours["metrics"], reference["metrics"])
    assert ours["config"] == reference["config"]
