"""Two commits of hf_lightning side by side: import time and the tiny workload's step and start-up, interleaved.

    python benchmarks/commit_pair.py --before 0712096 --after HEAD [--repeats 5] [--out FILE]

Each commit is exported with `git archive` into a scratch folder and byte-compiled once; every repeat then runs, one
process at a time, transformers.Trainer (the shared yardstick) and for each commit: the CPU time of
`from hf_lightning import Trainer, TrainingArguments` after `import torch` (hf_lightning's own import), and the tiny
workload (`GUARD_STEPS` steps, one thread) through `benchmarks.worker` with that commit's code. Ratios after / before
are paired per repeat and reported as the median: what a change of structure costs, on CPU time, which a neighbour's
load moves much less than wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.bytecode import compile_tree  # noqa: E402
from benchmarks.guard import GUARD_STEPS  # noqa: E402

IMPORT_CPU = (
    "import time, torch\n"
    "start = time.process_time()\n"
    "from hf_lightning import Trainer, TrainingArguments\n"
    "print(time.process_time() - start)\n"
)
FIGURES = ("import_cpu_s", "cpu_ms_per_step", "first_step_cpu_s", "cpu_ms_per_step_vs_transformers")


def export(revision: str, folder: Path) -> Path:
    """The tree of `revision` written under `folder` (what the commit holds, nothing of the working tree)."""
    archive = subprocess.run(["git", "archive", revision], cwd=REPO, check=True, capture_output=True).stdout
    folder.mkdir(parents=True)
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    compile_tree(folder)  # both trees timed from their bytecode, as from an installed copy
    return folder


def _environment(tree: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def tiny_job(tree: Path, runner: str, scratch: Path) -> dict:
    """One tiny-workload run of `runner` with the code of `tree`, in a fresh process."""
    out = scratch / f"{runner}-{os.getpid()}.json"
    job = [{"workload": "tiny", "runner": runner, "scale": "quick", "repeat": 0, "steps": GUARD_STEPS}]
    command = [sys.executable, "-m", "benchmarks.worker", "--jobs", json.dumps(job), "--out", str(out),
               "--scratch", str(scratch)]
    subprocess.run(command, cwd=tree, env=_environment(tree), check=True, capture_output=True)
    result = json.loads(out.read_text())[0]
    if "error" in result:
        raise RuntimeError(f"{runner} at {tree}: {result['error']}")
    return result


def import_cpu(tree: Path) -> float:
    """CPU seconds of hf_lightning's public import, torch already imported."""
    command = [sys.executable, "-c", IMPORT_CPU]
    return float(subprocess.run(command, cwd=tree, env=_environment(tree), check=True, capture_output=True,
                                text=True).stdout)


def compare(trees: dict[str, Path], repeats: int, scratch: Path) -> dict:
    """Per repeat: transformers.Trainer once, then each tree's import and tiny run; the paired after / before ratios."""
    figures: dict[str, dict[str, list[float]]] = {name: {figure: [] for figure in FIGURES} for name in trees}
    for tree in trees.values():
        import_cpu(tree)  # byte-compile before timing
    for _ in range(repeats):
        reference = tiny_job(trees["after"], "transformers", scratch)
        for name, tree in trees.items():
            run = tiny_job(tree, "hf_lightning", scratch)
            figures[name]["import_cpu_s"].append(import_cpu(tree))
            figures[name]["cpu_ms_per_step"].append(run["cpu_ms_per_step"])
            figures[name]["first_step_cpu_s"].append(run["first_step_cpu_s"])
            figures[name]["cpu_ms_per_step_vs_transformers"].append(
                run["cpu_ms_per_step"] / reference["cpu_ms_per_step"]
            )
    ratios = {
        figure: [after / before for after, before in zip(figures["after"][figure], figures["before"][figure])]
        for figure in FIGURES
    }
    return {
        "figures": figures,
        "after_over_before": {figure: {"median": statistics.median(values), "per_repeat": values}
                              for figure, values in ratios.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the commit measured as the baseline")
    parser.add_argument("--after", default="HEAD", help="the commit measured against it (default HEAD)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="where to write the figures as JSON")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="commit-pair-") as scratch_root:
        scratch = Path(scratch_root)
        trees = {name: export(revision, scratch / name) for name, revision in
                 (("before", options.before), ("after", options.after))}
        result = compare(trees, options.repeats, scratch)
    result.update(before=options.before, after=options.after, repeats=options.repeats)
    for figure, ratio in result["after_over_before"].items():
        spread = ", ".join(f"{value:.3f}" for value in ratio["per_repeat"])
        print(f"{figure}: after / before {ratio['median']:.3f} (per repeat {spread})")
    if options.out:
        Path(options.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
