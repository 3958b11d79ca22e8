"""Side-by-side `torchrun --nproc_per_node=2` launches (gloo, CPU) of one script, ours and the reference's."""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORLD_SIZE = 2


def checkpoint_listing(path: str) -> dict:
    """Every folder under `path`'s `checkpoint-*` folders (relative path) -> its sorted file names."""
    folders = {}
    for root, _, files in sorted(os.walk(path)):
        relative = os.path.relpath(root, path)
        if relative != "." and relative.split(os.sep)[0].startswith("checkpoint-"):
            folders[relative] = sorted(files)
    return folders


def free_port() -> int:
    """A TCP port nothing listens on now (for the launcher's rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_rank_report(output_dir: str, side: str, report: object) -> None:
    """In a launched worker: pickle this rank's `report` where `side_by_side` reads it."""
    rank = int(os.environ.get("RANK", "0"))
    (Path(output_dir) / f"{side}_rank{rank}.pkl").write_bytes(pickle.dumps(report))


def launch(script: Path, side: str, output_dir: Path, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    """Start `script side output_dir *extra` under torchrun, free of this process's rank variables."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")
    }
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={WORLD_SIZE}",
        f"--master_port={free_port()}", str(script), side, str(output_dir), *extra,
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def side_by_side(
    script: Path, output_dir: Path, timeout: float, extra: tuple[str, ...] = ()
) -> dict[str, list[dict]]:
    """Per side ("ours", "reference"), what each rank pickled to `output_dir/<side>_rank<r>.pkl`; both at once
    (`extra`: more arguments for the script)."""
    processes = {side: launch(script, side, output_dir, extra) for side in ("ours", "reference")}
    results = {}
    for side, process in processes.items():
        output, _ = process.communicate(timeout=timeout)
        assert process.returncode == 0, f"{side} launch failed:\n{output[-6000:]}"
        results[side] = [
            pickle.loads((output_dir / f"{side}_rank{rank}.pkl").read_bytes()) for rank in range(WORLD_SIZE)
        ]
    return results
