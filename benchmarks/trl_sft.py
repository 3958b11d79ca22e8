"""SFT steps/s, stock TRL (trl.SFTTrainer on transformers) against hf_lightning.trl.SFTTrainer, side by side.

Each run is a fresh subprocess (one thread, `OMP_NUM_THREADS=1`), the two sides interleaved across repeats
(stock ours stock ours ...), on the same tiny Llama (from a config), in-process tokenizer, conversational
data and seed. Steady-state ms per step is the median interval between optimizer-step ends after warm-up
(benchmarks/timing.py's StepClock, fed by a TrainerCallback both trainers call).

    python benchmarks/trl_sft.py                # 300 steps, 3 repeats, then the table
    python benchmarks/trl_sft.py --smoke        # 12 steps, 1 repeat: proves the script works (its timings mean nothing)
    python benchmarks/trl_sft.py --out FILE     # also write the results as JSON
    python benchmarks/trl_sft.py --paired 8     # one process, 8 rounds of both sides (ABBA order), per-round ratios

`--paired N` runs both trainers in one process pinned to one core, alternating whole runs (stock ours ours stock
...), after one untimed run of each (imports, first-step set-up): this machine's speed drifts by tens of percent
between processes, which the separate-process mode sees as noise; within a round both sides meet the same drift.
It reports the median (min-max) of the per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIDES = ("stock", "ours")


def worker(side: str, steps: int, out_dir: str) -> dict:
    """One SFT run in this process; its step clock's summary, final loss and step count."""
    sys.path.insert(0, str(REPO))
    import torch
    import transformers

    from benchmarks.timing import StepClock
    from tests.trl import harness, tiny

    torch.set_num_threads(1)
    clock = StepClock()

    class Tick(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            clock.tick()

    clock.imports_done()
    run = harness.run(
        side, Path(out_dir), tiny.conversational_dataset(), max_steps=steps, save_strategy="no",
        logging_steps=max(1, steps // 4), per_device_train_batch_size=4, trainer_kwargs={"callbacks": [Tick()]},
    )
    losses = [entry["loss"] for entry in run.log_history if "loss" in entry]
    return {**clock.summary(), "side": side, "global_step": run.trainer.state.global_step, "last_loss": losses[-1]}


def paired(rounds: int, steps: int) -> dict:
    """Both sides in this process, `rounds` rounds in ABBA order after one untimed run of each; per-round ratios."""
    os.environ.update({"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"})
    with tempfile.TemporaryDirectory() as folder:
        for side in SIDES:  # untimed: imports, kernels, the first run's one-off set-up
            worker(side, max(12, steps // 10), str(Path(folder) / f"warm-{side}"))
        rows = []
        for round_index in range(rounds):
            order = SIDES if round_index % 2 == 0 else SIDES[::-1]
            row = {side: worker(side, steps, str(Path(folder) / f"{round_index}-{side}")) for side in order}
            if row["stock"]["last_loss"] != row["ours"]["last_loss"]:
                raise SystemExit(f"round {round_index}: the two sides disagree on the loss: {row}")
            rows.append(row)
    ratios = [row["stock"]["ms_per_step"] / row["ours"]["ms_per_step"] for row in rows]
    return {"steps": steps, "rounds": rounds, "rows": rows, "steps_per_s_ratios": ratios}


def paired_table(result: dict) -> str:
    """Median ms per step of each side and the median (min-max) of the per-round ratios of steps/s."""
    rows = ["| trainer | steady ms/step (median of rounds) |", "|---|---|"]
    names = {"stock": "trl.SFTTrainer (transformers)", "ours": "hf_lightning.trl.SFTTrainer"}
    for side in SIDES:
        rows.append(f"| {names[side]} | {statistics.median(r[side]['ms_per_step'] for r in result['rows']):.2f} |")
    ratios = result["steps_per_s_ratios"]
    rows.append(
        f"\nours / stock steps/s per round: {statistics.median(ratios):.3f}x "
        f"({min(ratios):.3f}-{max(ratios):.3f}) over {len(ratios)} rounds"
    )
    return "\n".join(rows)


def _spawn(side: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        result_file = Path(folder) / "result.json"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
               "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO),
               "BENCH_SPAWN_MONOTONIC": str(time.monotonic())}
        command = [sys.executable, __file__, "--worker", side, "--steps", str(steps),
                   "--run-dir", str(Path(folder) / "run"), "--result", str(result_file)]
        completed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        if completed.returncode != 0:
            raise RuntimeError(f"{side} run failed:\n{completed.stderr[-3000:]}")
        return json.loads(result_file.read_text())


def table(results: list[dict]) -> str:
    """Median steady steps/s per side and ours / stock."""
    ms = {side: statistics.median(r["ms_per_step"] for r in results if r["side"] == side) for side in SIDES}
    rows = ["| trainer | steady ms/step | steps/s |", "|---|---|---|"]
    names = {"stock": "trl.SFTTrainer (transformers)", "ours": "hf_lightning.trl.SFTTrainer"}
    for side in SIDES:
        rows.append(f"| {names[side]} | {ms[side]:.2f} | {1000 / ms[side]:.1f} |")
    rows.append(f"\nours / stock steps/s: {ms['stock'] / ms['ours']:.2f}x")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out")
    parser.add_argument("--paired", type=int, metavar="ROUNDS", help="both sides in one process, ROUNDS rounds")
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    cli = parser.parse_args()
    if cli.worker:
        Path(cli.result).write_text(json.dumps(worker(cli.worker, cli.steps, cli.run_dir)))
        return
    steps, repeats = (12, 1) if cli.smoke else (cli.steps, cli.repeats)
    if cli.paired:
        result = paired(cli.paired, steps)
        print(paired_table(result))
        if cli.out:
            Path(cli.out).write_text(json.dumps(result, indent=1))
        return
    results = [_spawn(side, steps) for _ in range(repeats) for side in SIDES]
    print(table(results))
    if cli.out:
        Path(cli.out).write_text(json.dumps({"steps": steps, "repeats": repeats, "results": results}, indent=1))


if __name__ == "__main__":
    main()
