"""The performance guard CI runs: a short interleaved pair on the tiny workload, relative figures, generous bounds.

    python benchmarks/guard.py            # about a minute; exit status 1 when a figure drifted past its bound

Three repeats of hand loop, transformers.Trainer and hf_lightning, one fresh process at a time (A B C A B C ...),
each on the tiny MLP for `GUARD_STEPS` steps. The figures are CPU-time based (a neighbour's load moves wall time,
much less a single-threaded process's own CPU time) and paired per repeat, the median of the per-repeat ratios
judged. Each bound is the figure measured when the guard was set (the 2-core CI machine, three runs, the
highest median rounded up) plus 20%: it catches a drift of a fifth without failing on a noisy machine (the
per-repeat spread of these CPU-time ratios was under 3%). The full suite (benchmarks/run.py) stays the
measurement and holds the targets; this is its tripwire.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.bytecode import compile_tree  # noqa: E402
from benchmarks.report import paired_ratio, step_count_problems  # noqa: E402
from benchmarks.run import run_group  # noqa: E402

GUARD_STEPS = 600
RUNNERS = ("hand", "transformers", "hf_lightning")
DRIFT = 1.2
# (metric, baseline, the figure measured when the guard was set); bound = figure x DRIFT.
GUARDED = (
    ("cpu_ms_per_step", "transformers", 0.72),
    ("cpu_ms_per_step", "hand", 1.28),
    ("first_step_cpu_s", "transformers", 0.69),  # 0.82 until Lightning loaded without full collections
    ("peak_rss_mb", "transformers", 0.83),
)


def run_guard(repeats: int, scratch: str) -> list[dict]:
    """`repeats` interleaved rounds of every runner on the tiny workload, one process at a time."""
    compile_tree(REPO)  # every timed process reads the bytecode, as from an installed copy
    results = []
    for repeat in range(repeats):
        for runner in RUNNERS:
            job = {"workload": "tiny", "runner": runner, "scale": "quick", "repeat": repeat, "steps": GUARD_STEPS}
            results += run_group([job], cpu=None, threads=1, scratch=scratch)
    return results


def judge(results: list[dict]) -> list[dict]:
    """Each guarded figure: its median ratio, its bound, and whether it holds."""
    rows = []
    for metric, baseline, figure in GUARDED:
        ratio = paired_ratio(results, "tiny", metric, "hf_lightning", baseline)
        bound = round(figure * DRIFT, 3)
        median = ratio["median"] if ratio else None
        rows.append({"metric": metric, "baseline": baseline, "ratio": ratio, "bound": bound,
                     "holds": median is not None and median <= bound})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="also write the results and the judgement as JSON here")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hf-lightning-guard-") as scratch:
        results = run_guard(options.repeats, scratch)
    errors = [f"{r['runner']}: {r['error']}" for r in results if r.get("error")]
    problems = errors + step_count_problems(results)
    rows = judge(results)
    for row in rows:
        ratio = row["ratio"]
        shown = f"{ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f})" if ratio else "missing"
        verdict = "ok" if row["holds"] else "DRIFTED"
        print(f"tiny {row['metric']} hf_lightning / {row['baseline']}: {shown}, bound {row['bound']}: {verdict}")
    if options.out:
        Path(options.out).write_text(json.dumps({"results": results, "judgement": rows}, indent=1))
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 0 if not problems and all(row["holds"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
