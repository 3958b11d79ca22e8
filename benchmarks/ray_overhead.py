"""Ray's costs, ours against the reference's: the per-trial wall time of a Ray Tune search, and the step time of a
two-worker Ray Train run against the same run under torchrun (gloo, CPU, one local Ray cluster of 2 CPUs).

    python benchmarks/ray_overhead.py                 # 3 interleaved repeats
    python benchmarks/ray_overhead.py --repeats 5 --out benchmarks/results/ray_overhead.json
    python benchmarks/ray_overhead.py --smoke         # tiny sizes, 1 repeat: proves the script works

Per repeat:
- `tune_per_trial_s` (hf_lightning, transformers): `hyperparameter_search(backend="ray")` wall time over its trials
  (`--trials` learning rates of a grid, one trial at a time, 16 updates of a small MLP, an evaluation and a trial
  checkpoint every 4): worker start-up, the trainer's transfer, training, reports and checkpoints;
- `step_ms` (ray_train, torchrun): the median time between the ends of consecutive updates after the first 5, of
  our Trainer on 2 processes, launched by `ray.train.torch.TorchTrainer` (the transformers-on-Ray recipe) and by
  `torchrun --nproc_per_node=2`, no checkpoints.
Medians over the repeats, and the ratios ours / reference and Ray Train / torchrun.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # run by torch.distributed.run as a script
    sys.path.insert(0, REPO)


def _parts(side: str):
    """The trainer classes of one side, a small MLP regression and its data."""
    import torch
    from torch import nn

    if side == "transformers":
        from transformers import Trainer, TrainerCallback, TrainingArguments
    else:
        from hf_lightning import Trainer, TrainingArguments
        from hf_lightning.callbacks import TrainerCallback

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))

        def forward(self, x, labels=None):
            logits = self.net(x).squeeze(-1)
            return {"loss": nn.functional.mse_loss(logits, labels), "logits": logits}

    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(512, 32, generator=generator), torch.randn(512, generator=generator)
    rows = [{"x": x[i], "labels": y[i]} for i in range(len(x))]
    return Trainer, TrainerCallback, TrainingArguments, MLP, rows


def train_worker(config: dict) -> None:
    """One process of the step-time run: our Trainer, `steps` updates, each update's end time to a file."""
    import torch

    torch.set_num_threads(1)
    Trainer, TrainerCallback, TrainingArguments, MLP, rows = _parts("hf_lightning")
    rank = int(os.environ.get("RANK", "0"))
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter())

    args = TrainingArguments(
        output_dir=os.path.join(config["out"], "run"), max_steps=config["steps"], save_strategy="no",
        per_device_train_batch_size=16, report_to="none", use_cpu=True, disable_tqdm=True, ddp_backend="gloo",
    )  # fmt: skip
    trainer = Trainer(model=MLP(), args=args, train_dataset=rows, callbacks=[Clock()])
    if config.get("ray"):
        from ray.train.huggingface.transformers import prepare_trainer  # the documented recipe

        trainer = prepare_trainer(trainer)
    trainer.train()
    if rank == 0:
        with open(os.path.join(config["out"], "times.json"), "w") as handle:
            json.dump(times, handle)


def _median_step_ms(out: str) -> float:
    with open(os.path.join(out, "times.json")) as handle:
        times = json.load(handle)[5:]
    return 1000 * statistics.median(b - a for a, b in zip(times, times[1:]))


def step_ms_ray(steps: int) -> float:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    with tempfile.TemporaryDirectory() as out:
        TorchTrainer(
            train_worker, train_loop_config={"out": out, "steps": steps, "ray": True},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="step", storage_path=os.path.join(out, "ray")),
        ).fit()  # fmt: skip
        return _median_step_ms(out)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def step_ms_torchrun(steps: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        environment = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
        environment.update(OMP_NUM_THREADS="1", PYTHONPATH=REPO)
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
            os.path.abspath(__file__), "--worker", json.dumps({"out": out, "steps": steps}),
        ]  # fmt: skip
        subprocess.run(command, env=environment, check=True, capture_output=True, timeout=120)
        return _median_step_ms(out)


def tune_per_trial_s(side: str, trials: int, steps: int) -> float:
    from ray import tune

    Trainer, _, TrainingArguments, MLP, rows = _parts(side)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=os.path.join(out, "search"), max_steps=steps, eval_strategy="steps", eval_steps=4,
            save_steps=4, per_device_train_batch_size=16, report_to="none", use_cpu=True, disable_tqdm=True,
        )  # fmt: skip
        trainer = Trainer(model_init=lambda: MLP(), args=args, train_dataset=rows, eval_dataset=rows[:64])
        rates = [10 ** (-4 + 3 * i / max(trials - 1, 1)) for i in range(trials)]
        started = time.perf_counter()
        trainer.hyperparameter_search(
            hp_space=lambda trial: {"learning_rate": tune.grid_search(rates)}, backend="ray", n_trials=1,
            storage_path=os.path.join(out, "ray"), name="search", verbose=0, max_concurrent_trials=1,
        )  # fmt: skip
        return (time.perf_counter() - started) / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200, help="updates of the step-time runs")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat")
    parser.add_argument("--out", default=None, help="write the runs and medians as JSON here")
    options = parser.parse_args()
    if options.smoke:
        options.repeats, options.trials, options.steps = 1, 2, 12
    import ray

    os.environ["PYTHONPATH"] = REPO + os.pathsep + os.environ.get("PYTHONPATH", "")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    runs: dict[str, list[float]] = {"tune_ours": [], "tune_reference": [], "ray_train": [], "torchrun": []}
    try:
        for repeat in range(options.repeats):  # interleaved: A B A B ...
            runs["tune_ours"].append(tune_per_trial_s("hf_lightning", options.trials, 16))
            runs["tune_reference"].append(tune_per_trial_s("transformers", options.trials, 16))
            runs["ray_train"].append(step_ms_ray(options.steps))
            runs["torchrun"].append(step_ms_torchrun(options.steps))
            print(f"[{repeat + 1}/{options.repeats}] " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in runs.items()))
    finally:
        ray.shutdown()
    summary = {name: statistics.median(values) for name, values in runs.items()}
    summary["tune_per_trial_ours_over_reference"] = summary["tune_ours"] / summary["tune_reference"]
    summary["step_ray_train_over_torchrun"] = summary["ray_train"] / summary["torchrun"]
    print(json.dumps(summary, indent=2))
    if options.out:
        with open(options.out, "w") as handle:
            json.dump({"runs": runs, "summary": summary, "options": vars(options)}, handle, indent=2)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        train_worker(json.loads(sys.argv[2]))
    else:
        main()
