"""SFT steps/s, stock TRL (trl.SFTTrainer on transformers) against hf_lightning.trl.SFTTrainer, side by side.

Each run is a fresh subprocess (one thread, `OMP_NUM_THREADS=1`), the two sides interleaved across repeats
(stock ours stock ours ...), on the same tiny Llama (from a config), in-process tokenizer, conversational
data and seed. Steady-state ms per step is the median interval between optimizer-step ends after warm-up
(benchmarks/timing.py's StepClock, fed by a TrainerCallback both trainers call).

    python benchmarks/trl_sft.py                # 300 steps, 3 repeats, then the table
    python benchmarks/trl_sft.py --smoke        # 12 steps, 1 repeat: proves the script works (its timings mean nothing)
    python benchmarks/trl_sft.py --out FILE     # also write the results as JSON
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
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    cli = parser.parse_args()
    if cli.worker:
        Path(cli.result).write_text(json.dumps(worker(cli.worker, cli.steps, cli.run_dir)))
        return
    steps, repeats = (12, 1) if cli.smoke else (cli.steps, cli.repeats)
    results = [_spawn(side, steps) for _ in range(repeats) for side in SIDES]
    print(table(results))
    if cli.out:
        Path(cli.out).write_text(json.dumps({"steps": steps, "repeats": repeats, "results": results}, indent=1))


if __name__ == "__main__":
    main()
