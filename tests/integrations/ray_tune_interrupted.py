"""A Ray Tune search whose first trial stops after its step-4 report until released: the driver a test kills.

Run as `python -m tests.integrations.ray_tune_interrupted <cluster address> <folder> <workers>`; also the trainer
and search the test restores, so both calls are the same."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ray import tune
from ray.train import ScalingConfig

from hf_lightning import Trainer, TrainingArguments
from hf_lightning.callbacks import TrainerCallback
from tests.integrations.test_ray_tune import EVAL, LEARNING_RATES, TRAIN, model_init

HELD_SECONDS = 240  # a trial held longer than this fails rather than hanging the test


class HoldAfterFirstReport(TrainerCallback):
    """Holds the first learning rate's trial at step 5 (after the step-4 report) until `release` exists, writing
    `held` then; each start of training appends the step it starts from to `starts-<lr>`."""

    def __init__(self, folder: str):
        self.folder = folder

    def on_train_begin(self, args, state, control, **kwargs):
        with open(os.path.join(self.folder, f"starts-{state.trial_params['learning_rate']}"), "a") as starts:
            starts.write(f"{state.global_step}\n")

    def on_step_end(self, args, state, control, **kwargs):
        if state.trial_params["learning_rate"] != LEARNING_RATES[0] or state.global_step != 5:
            return
        release, held = Path(self.folder, "release"), Path(self.folder, "held")
        deadline = time.monotonic() + HELD_SECONDS
        while not release.exists():
            held.touch()
            if time.monotonic() > deadline:
                raise TimeoutError("the held trial was never released")
            time.sleep(0.2)


def space(trial):
    return {"learning_rate": tune.grid_search(LEARNING_RATES), "model_seed": 3}


def search(folder: str, workers: int, name: str, hold: bool = False, **kwargs):
    """The search of 2 trials (on `workers` Ray Train workers each when > 1, the global batch 4 either way)."""
    args = TrainingArguments(
        output_dir=os.path.join(folder, name), num_train_epochs=2, per_device_train_batch_size=4 // workers,
        eval_strategy="steps", eval_steps=2, save_steps=2, report_to="none", use_cpu=True, disable_tqdm=True,
    )
    callbacks = [HoldAfterFirstReport(folder)] if hold else []
    trainer = Trainer(model_init=model_init, args=args, train_dataset=TRAIN, eval_dataset=EVAL, callbacks=callbacks)
    if workers > 1:
        # One trial's workers at a time: a trial whose worker group Ray is placing while the driver dies can keep its
        # placement group on a cluster without the dashboard (Ray Train's PlacementGroupCleaner reads its state API).
        kwargs |= {"scaling_config": ScalingConfig(num_workers=workers), "max_concurrent_trials": 1}
    return trainer.hyperparameter_search(
        hp_space=space, backend="ray", n_trials=1, storage_path=os.path.join(folder, "ray"), name=name, verbose=0,
        **kwargs,
    )


if __name__ == "__main__":
    import ray

    address, folder, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    repo = str(Path(__file__).resolve().parents[2])
    ray.init(address=address, runtime_env={"env_vars": {"PYTHONPATH": repo, "RAY_SCOPE": "last"}}, log_to_driver=False)
    search(folder, workers, "interrupted", hold=True, resume=True)
