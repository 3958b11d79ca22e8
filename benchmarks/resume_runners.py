"""The `resume` workload: the cost of resuming mid-epoch as the position in the epoch grows.

One short `tiny` run (batch 4) writes a checkpoint at step 2; for each position P of the scale (10, 1,000 and
10,000 batches at quick / full size), a copy of it gets `global_step = P` in its `trainer_state.json`, and a new
trainer resumes from it with `max_steps = P + 1`, on a map-style dataset (seeded shuffling sampler) and on an
iterable one (the same examples in order) of more than P + 1 batches, plain (`iterable`) and with torch's Stateful
protocol (`stateful`). Each kind resumes a checkpoint its own run wrote at step 2, whose copy gets the data position
and loader state a run at step P records (`hf_lightning_data_position.json`, `hf_lightning_data_state.safetensors`,
which transformers.Trainer does not read: the step-2 files with their counts moved to P). Measured: the time from
`train(resume_from_checkpoint=...)` to the end of the first update (`on_step_end`), best of the scale's resume tries
(positions interleaved), per position and kind:
`<kind>_first_update_s@P`, and `<kind>_growth` = the time at the largest position / the time at the smallest
(flat: close to 1). The reference skips a map-style epoch's batches by index and replays an iterable one batch by
batch. `<kind>_final_loss@P`, the probe loss after each resume, is the agreement check (rows `resume:<kind>@P`):
both libraries resume the same checkpoint and make the same update.

A plain iterable dataset cannot be put back at a position: its skipped examples must be drawn. So the runner also
times drawing the P x batch examples from a fresh iterator of it, with nothing else done (`iterable_draw_s@P`,
best of 3), and reports `iterable_skip_over_draw` = (the time at the largest position - at the smallest) / (the
draw at the largest position - at the smallest): how much of what a resume further into the epoch adds is more
than the dataset's own cost of producing the examples (1: nothing more).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

import torch
from torch.utils.data import IterableDataset

from benchmarks.timing import StepClock
from benchmarks.workloads import TensorDictDataset, Workload, _regression_dataset, probe_loss

KINDS = ("map", "iterable", "stateful")
POSITION_FILE = "hf_lightning_data_position.json"  # hf_lightning/data/position_files.py's files
STATE_FILE = "hf_lightning_data_state.safetensors"
# The counts in a loader state that follow the position: batches drawn, and examples drawn / the next example.
_BATCH_COUNTS = ("_sampler_iter_yielded", "_num_yielded")
_EXAMPLE_COUNTS = ("samples_yielded", "next_index", "examples")


class InOrderIterable(IterableDataset):
    """The examples of a `TensorDictDataset`, in order, as an iterable dataset (no length)."""

    def __init__(self, dataset: TensorDictDataset):
        self.dataset = dataset

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for index in range(len(self.dataset)):
            yield self.dataset[index]


class PositionedIterable(InOrderIterable):
    """`InOrderIterable` with torch's Stateful protocol: `state_dict()` is the next example's index, and
    `load_state_dict()` makes the next iteration start there (as HF datasets' IterableDataset resumes)."""

    def __init__(self, dataset: TensorDictDataset):
        super().__init__(dataset)
        self.next_index = 0
        self.start = 0

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        start, self.start = self.start, 0
        for index in range(start, len(self.dataset)):
            self.next_index = index + 1
            yield self.dataset[index]

    def state_dict(self) -> dict[str, int]:
        return {"next_index": self.next_index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start = state["next_index"]


def _draw_seconds(dataset: TensorDictDataset, examples: int, tries: int = 3) -> float:
    """The best time over `tries` to draw the first `examples` examples of `InOrderIterable(dataset)`, discarding them."""
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        deque(islice(iter(InOrderIterable(dataset)), examples), maxlen=0)
        best = min(best, time.perf_counter() - start)
    return best


def _moved(value: Any, batch: int, batch_size: int) -> Any:
    """A loader state (torchdata's `StatefulDataLoader.state_dict()`) with its counts moved to batch `batch`."""
    if isinstance(value, dict):
        moved = {}
        for key, item in value.items():
            if key in _BATCH_COUNTS and isinstance(item, int):
                moved[key] = batch
            elif key in _EXAMPLE_COUNTS and isinstance(item, int):
                moved[key] = batch * batch_size
            else:
                moved[key] = _moved(item, batch, batch_size)
        return moved
    return [_moved(item, batch, batch_size) for item in value] if isinstance(value, list) else value


def _set_data_position(checkpoint: str, batch: int, batch_size: int) -> None:
    """The data position (and loader state) a run writes at batch `batch` of epoch 0, from those of the step-2
    checkpoint of the same kind copied into `checkpoint`."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    position_path, state_path = os.path.join(checkpoint, POSITION_FILE), os.path.join(checkpoint, STATE_FILE)
    with open(position_path, encoding="utf-8") as handle:
        position = json.load(handle)
    position.update(global_step=batch, batch=batch, samples_in_epoch=batch * batch_size)
    with open(position_path, "w", encoding="utf-8") as handle:
        json.dump(position, handle)
    if not os.path.isfile(state_path):  # a map-style dataset's sampler holds its position
        return
    with safe_open(state_path, framework="pt") as handle:
        metadata = dict(handle.metadata())
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    metadata["state"] = json.dumps(_moved(json.loads(metadata["state"]), batch, batch_size))
    save_file(tensors, state_path, metadata=metadata)


def _set_global_step(checkpoint: str, step: int) -> None:
    path = os.path.join(checkpoint, "trainer_state.json")
    with open(path, encoding="utf-8") as handle:
        state = json.load(handle)
    state["global_step"] = step
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(state, handle, indent=2, sort_keys=True)


def _run_resume(workload: Workload, output_dir: str, trainer_cls: type, args_cls: type, callback_base: type):
    positions = workload.extra["positions"]
    num_examples = workload.batch_size * (max(positions) + 2)
    dataset = _regression_dataset(num_examples, 42)
    marks: dict[str, float] = {}

    class FirstUpdate(callback_base):
        def on_step_end(self, args, state, control, **kwargs):
            marks.setdefault("first_update", time.perf_counter())

    def make(run_dir: str, train_dataset: Any, max_steps: int, save: bool) -> Any:
        args = {**workload.trainer_args(run_dir), "max_steps": max_steps}
        if save:
            args.update(save_strategy="steps", save_steps=2)
        return trainer_cls(
            model=workload.seeded_model(),
            args=args_cls(**args),
            train_dataset=train_dataset,
            callbacks=[FirstUpdate()],
        )

    wrappers = {"iterable": InOrderIterable, "stateful": PositionedIterable}
    sources = {}
    for kind in KINDS:  # hf_lightning's checkpoints hold the data position (and loader state) of their kind
        source_dir = os.path.join(output_dir, f"source-{kind}")
        make(source_dir, wrappers[kind](dataset) if kind in wrappers else dataset, 2, save=True).train()
        sources[kind] = os.path.join(source_dir, "checkpoint-2")
    result: dict[str, Any] = {}
    tries = workload.extra.get("tries", 1)
    for kind in KINDS:
        source = sources[kind]
        times: dict[int, float] = {}
        for _ in range(tries):  # positions interleaved, best of the tries: a shared machine's noise is one-sided
            for position in positions:
                run_dir = os.path.join(output_dir, f"{kind}-{position}")
                checkpoint = os.path.join(run_dir, f"checkpoint-{position}")
                shutil.copytree(source, checkpoint)
                _set_global_step(checkpoint, position)
                if os.path.isfile(os.path.join(checkpoint, POSITION_FILE)):  # written by hf_lightning
                    _set_data_position(checkpoint, position, workload.batch_size)
                train_dataset = wrappers[kind](dataset) if kind in wrappers else dataset
                trainer = make(run_dir, train_dataset, position + 1, save=False)
                marks.clear()
                start = time.perf_counter()
                trainer.train(resume_from_checkpoint=checkpoint)
                times[position] = min(times.get(position, float("inf")), marks["first_update"] - start)
                result[f"{kind}_first_update_s@{position}"] = times[position]
                result[f"{kind}_final_loss@{position}"] = probe_loss(trainer.model, workload)
                shutil.rmtree(run_dir, ignore_errors=True)
        result[f"{kind}_growth"] = times[max(positions)] / times[min(positions)]
        if kind == "iterable":
            draws = {position: _draw_seconds(dataset, position * workload.batch_size) for position in positions}
            result.update({f"iterable_draw_s@{position}": draws[position] for position in positions})
            first, last = min(positions), max(positions)
            drawn_more = draws[last] - draws[first]  # > 0 but for timer noise at the smoke scale's few examples
            result["iterable_skip_over_draw"] = (times[last] - times[first]) / drawn_more if drawn_more > 0 else None
    return result


def run_transformers_resume(workload: Workload, clock: StepClock, output_dir: str) -> dict[str, Any]:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    clock.imports_done()
    return _run_resume(workload, output_dir, Trainer, TrainingArguments, TrainerCallback)


def run_hf_lightning_resume(workload: Workload, clock: StepClock, output_dir: str) -> dict[str, Any]:
    from hf_lightning import Trainer, TrainerCallback, TrainingArguments

    clock.imports_done()
    return _run_resume(workload, output_dir, Trainer, TrainingArguments, TrainerCallback)


RESUME_RUNNERS: dict[str, Callable[[Workload, StepClock, str], dict[str, Any]]] = {
    "transformers": run_transformers_resume,
    "hf_lightning": run_hf_lightning_resume,
}
