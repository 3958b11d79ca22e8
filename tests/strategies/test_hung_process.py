"""A process that stops making progress is named: the job fails within about `ddp_timeout` (plus a roll call of a
few seconds) with one message naming the timeout, the update and the process that did not arrive, the last complete
checkpoint untouched and no scratch folder left, and a non-zero exit status. The reference, on CPU, never passes
`ddp_timeout` to its process group (gloo's 30-minute default) and hangs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hf_lightning.checkpoint.files import is_complete_checkpoint, list_checkpoints
from tests.distributed.launching import free_port

pytestmark = pytest.mark.slow  # a 2-process launch that waits for its timeout

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "distributed" / "hung_process_script.py"
DDP_TIMEOUT = 15


@pytest.mark.parametrize("hang_rank", ["1", "0"])
def test_the_process_that_did_not_arrive_is_named_within_the_timeout(tmp_path, hang_rank):
    environment = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    environment.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HANG_RANK=hang_rank, DDP_TIMEOUT=str(DDP_TIMEOUT))
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
        str(SCRIPT), str(tmp_path / "run"),
    ]  # fmt: skip
    started = time.monotonic()
    completed = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=400)
    elapsed = time.monotonic() - started
    assert completed.returncode != 0
    assert (
        f"A collective waited longer than ddp_timeout={DDP_TIMEOUT} s during update 6: process {hang_rank} did not "
        "arrive"
    ) in completed.stderr, completed.stderr[-4000:]
    assert elapsed < 300  # bounded by the timeout, not by the sleeping process (600 s)
    (step, checkpoint), = list_checkpoints(str(tmp_path / "run"))
    assert step == 4 and is_complete_checkpoint(checkpoint)
    assert not [name for name in os.listdir(tmp_path / "run") if name.startswith(".")]
