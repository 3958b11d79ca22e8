"""`trainer.accelerator` against accelerate's own `Accelerator`: the same calls on both, the same results.

`report(side, out_dir)` builds a trainer (`ours`: hf_lightning, `reference`: transformers, whose accelerator is
accelerate's), makes the same accelerator calls before training, during training and evaluation (from a
`compute_loss` override, as a TRL trainer does) and on a prepared DataLoader, and returns plain values.
tests/engine/test_accelerator.py calls it in one process; under
`python -m torch.distributed.run --nproc_per_node=2 tests/distributed/accelerator_script.py <side> <out_dir>`
each rank pickles its report to `<out_dir>/<side>_rank<R>.pkl` (tests/engine/test_accelerator_distributed.py).
"""

from __future__ import annotations

import copy
import io
import os
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.models import ListDataset, make_regression_mlp, regression_data  # noqa: E402

# 11 training samples, batches of 2, accumulation 2: the last batch of an epoch is short (1 sample in one
# process; with 2 processes the last round is completed from the first samples, remainder 11 % 4 = 3).
NUM_TRAIN, NUM_EVAL, BATCH_SIZE, ACCUMULATION = 11, 5, 2, 2


def plain(value: Any) -> Any:
    """Tensors (also nested) as (dtype, list) pairs, everything else as it is, for exact comparison."""
    if isinstance(value, torch.Tensor):
        return (str(value.dtype).replace("torch.", ""), value.detach().cpu().tolist())
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(item) for item in value) if not hasattr(value, "_fields") else value
    return value


def reset_reference_state() -> None:
    """A fresh accelerate state, as a new process has (its state is a per-process singleton)."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


def trainer_classes(side: str) -> tuple[type, type]:
    """(Trainer, TrainingArguments) of one side."""
    if side == "ours":
        from hf_lightning import Trainer, TrainingArguments
    else:
        from transformers import Trainer, TrainingArguments

        reset_reference_state()
    return Trainer, TrainingArguments


def recording_trainer(trainer_cls: type) -> type:
    """A subclass whose `compute_loss` records what a TRL trainer reads of its accelerator at each call."""

    class Recording(trainer_cls):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            # TRL reads its accelerator in __init__.
            self.at_init = {
                "num_processes": self.accelerator.num_processes,
                "is_main_process": self.accelerator.is_main_process,
                "parallelism_config": self.accelerator.parallelism_config,
                "device": str(self.accelerator.device),
            }
            self.records: list[dict] = []

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            accelerator = self.accelerator
            gradient_state = accelerator.gradient_state
            self.records.append(
                {
                    "training": model.training,
                    "labels": plain(accelerator.gather_for_metrics(inputs["labels"])),
                    "repeated": plain(accelerator.gather_for_metrics(inputs["labels"].repeat(3))),
                    "objects": accelerator.gather_for_metrics([len(inputs["labels"])]),
                    "count": plain(accelerator.reduce(torch.tensor(float(len(inputs["labels"]))), "sum")),
                    "end_of_dataloader": gradient_state.end_of_dataloader,
                    "remainder": gradient_state.remainder,
                    "sync_gradients": accelerator.sync_gradients,
                }
            )
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    return Recording


def _facts(accelerator: Any) -> dict[str, Any]:
    state = accelerator.state
    return {
        "device": str(accelerator.device),
        "num_processes": accelerator.num_processes,
        "process_index": accelerator.process_index,
        "local_process_index": accelerator.local_process_index,
        "is_main_process": accelerator.is_main_process,
        "is_local_main_process": accelerator.is_local_main_process,
        "is_last_process": accelerator.is_last_process,
        "distributed_type": str(accelerator.distributed_type.value),
        "distributed_type_equal": accelerator.distributed_type == accelerator.state.distributed_type,
        "mixed_precision": accelerator.mixed_precision,
        "use_distributed": accelerator.use_distributed,
        "parallelism_config": accelerator.parallelism_config,
        "sync_gradients": accelerator.sync_gradients,
        "split_batches": accelerator.split_batches,
        "even_batches": accelerator.even_batches,
        "dispatch_batches": accelerator.dispatch_batches,
        "use_seedable_sampler": accelerator.use_seedable_sampler,
        "non_blocking": accelerator.non_blocking,
        "plugin_kwargs": dict(accelerator.gradient_state.plugin_kwargs),
        "num_steps": accelerator.gradient_state.num_steps,
        "end_of_dataloader": accelerator.gradient_state.end_of_dataloader,
        "remainder": accelerator.gradient_state.remainder,
        "state": (state.num_processes, state.process_index, state.is_main_process, str(state.device)),
        "multi_device": accelerator.multi_device,
        "should_save_model": accelerator.should_save_model,
        "use_stateful_dataloader": accelerator.use_stateful_dataloader,
        "is_composable_parallelism_enabled": accelerator.is_composable_parallelism_enabled,
        "torch_device_mesh": accelerator.torch_device_mesh,
        "is_fsdp2": accelerator.is_fsdp2,
        "accelerator_deepspeed_plugin": accelerator.deepspeed_plugin,
        "deepspeed_plugin": getattr(state, "deepspeed_plugin", None),
        "fsdp_plugin": getattr(state, "fsdp_plugin", None),
    }


def object_operations(accelerator: Any) -> tuple[Any, Any]:
    """(gather_object, broadcast): our accelerator's methods, accelerate's `accelerate.utils` functions."""
    if hasattr(accelerator, "gather_object"):
        return accelerator.gather_object, accelerator.broadcast
    from accelerate.utils import broadcast, gather_object

    return gather_object, broadcast


def _collectives(accelerator: Any, out_dir: str, tag: str) -> dict[str, Any]:
    rank, world = accelerator.process_index, accelerator.num_processes
    gather_object, broadcast = object_operations(accelerator)
    row = torch.tensor([rank, rank + 10])
    results: dict[str, Any] = {
        "gather": accelerator.gather(row),
        "gather_0d": accelerator.gather(torch.tensor(float(rank))),
        "gather_nested": accelerator.gather({"a": row, "b": (row * 2, torch.ones(1, 2) * rank)}),
        "gather_for_metrics": accelerator.gather_for_metrics(row),
        "gather_object": gather_object([f"rank{rank}", {"r": rank}]),
        "reduce_sum": accelerator.reduce(torch.tensor([rank + 1.0, 2.0]), "sum"),
        "reduce_mean": accelerator.reduce(torch.tensor([rank + 1.0, 2.0]), "mean"),
        "reduce_max": accelerator.reduce(torch.tensor([rank + 1.0, 2.0]), "max"),
        "reduce_nested": accelerator.reduce({"x": torch.tensor([float(rank)])}, "sum"),
        "pad_dim1": accelerator.pad_across_processes(torch.ones(2, rank + 1), dim=1, pad_index=-1),
        "pad_first": accelerator.pad_across_processes(torch.ones(rank + 1, 2), dim=0, pad_first=True),
        "pad_beyond": accelerator.pad_across_processes(torch.ones(3), dim=2),
        "broadcast_0": broadcast(torch.tensor([rank, rank * 3])),
        "broadcast_last": broadcast(torch.tensor([float(rank)]), from_process=world - 1),
        "broadcast_nested": broadcast([torch.tensor([rank]), {"k": torch.tensor([rank + 5])}]),
    }
    for name, inputs in {
        "list": list("abcde"),
        "tuple": tuple(range(3)),
        "tensor": torch.arange(5),
        "dict": {"a": [1, 2, 3], "b": torch.arange(3)},
        "short": ["only"],
    }.items():
        for padding in (False, True):
            try:
                with accelerator.split_between_processes(
                    copy.deepcopy(inputs), apply_padding=padding
                ) as share:
                    results[f"split_{name}_{padding}"] = share
            except TypeError as error:  # accelerate pads a tuple by adding a list to it (docs/divergences.md)
                results[f"split_{name}_{padding}"] = f"TypeError: {error}"
    order_file = Path(out_dir) / f"{tag}_order.txt"
    accelerator.wait_for_everyone()
    with accelerator.main_process_first():
        with order_file.open("a") as handle:
            handle.write(f"{rank}\n")
    accelerator.wait_for_everyone()
    with accelerator.local_main_process_first():
        with order_file.open("a") as handle:
            handle.write(f"local{accelerator.local_process_index}\n")
    accelerator.wait_for_everyone()
    results["main_process_first_order"] = order_file.read_text().split()
    printed = io.StringIO()
    with redirect_stdout(printed):
        accelerator.print("printed", rank)
    results["print"] = printed.getvalue()
    decorated = {
        "main": accelerator.on_main_process(lambda: "main"),
        "local_main": accelerator.on_local_main_process(lambda: "local main"),
        "last": accelerator.on_last_process(lambda: "last"),
        "process_1": accelerator.on_process(lambda: "process 1", process_index=1),
        "local_process_0": accelerator.on_local_process(lambda: "local 0", local_process_index=0),
    }
    results["decorators"] = {name: function() for name, function in decorated.items()}
    return {key: plain(value) for key, value in results.items()}


def _prepared_loader(accelerator: Any) -> list[dict]:
    dataset = ListDataset([{"v": torch.tensor(float(i))} for i in range(7)])
    loader = accelerator.prepare(DataLoader(dataset, batch_size=2, shuffle=False))
    rows = []
    for batch in loader:
        gradient_state = accelerator.gradient_state
        rows.append(
            {
                "batch": plain(batch["v"]),
                "device": str(batch["v"].device),
                "gathered": plain(accelerator.gather_for_metrics(batch["v"])),
                "objects": accelerator.gather_for_metrics([int(v) for v in batch["v"]]),
                "end_of_dataloader": gradient_state.end_of_dataloader,
                "remainder": gradient_state.remainder,
            }
        )
    rows.append({"after": accelerator.gradient_state.end_of_dataloader, "length": len(loader)})
    return rows


def _models(accelerator: Any, model: nn.Module) -> dict[str, Any]:
    results: dict[str, Any] = {
        "unwrap_plain": accelerator.unwrap_model(model) is model,
        "unwrap_data_parallel": accelerator.unwrap_model(nn.DataParallel(model)) is model,
        "state_dict_keys": sorted(accelerator.get_state_dict(nn.DataParallel(model))),
        "free_memory": accelerator.free_memory(torch.ones(1), torch.ones(2)),
    }
    frozen = copy.deepcopy(model).eval()
    frozen = accelerator.prepare_model(frozen, evaluation_mode=True)
    x = regression_data(3).items
    batch = torch.stack([item["x"] for item in x])
    with torch.no_grad():
        out = frozen(x=batch)
    results["prepared_logits"] = plain(out["logits"])
    results["prepared_device"] = str(next(frozen.parameters()).device)
    with accelerator.autocast():
        product = torch.ones(2, 2) @ torch.ones(2, 2)
    results["autocast_dtype"] = str(product.dtype)
    grad_model = copy.deepcopy(model)
    loss = grad_model(x=batch, labels=torch.zeros(3))["loss"]
    accelerator.backward(loss)
    norm = accelerator.clip_grad_norm_(grad_model.parameters(), 0.01)
    results["clip_norm"] = round(float(norm), 6)
    results["clipped_grads"] = [plain(p.grad) for p in grad_model.parameters()]
    accelerator.clip_grad_value_(grad_model.parameters(), 0.001)
    results["value_clipped_grads"] = [plain(p.grad) for p in grad_model.parameters()]
    results["verify_device_map"] = accelerator.verify_device_map(grad_model)
    return results


def report(side: str, out_dir: str, **arguments: Any) -> dict[str, Any]:
    """Everything one process observes of its trainer's accelerator (see the module docstring)."""
    trainer_cls, args_cls = trainer_classes(side)
    args = args_cls(
        output_dir=os.path.join(out_dir, f"{side}_output"),
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        per_device_train_batch_size=BATCH_SIZE,
        per_device_eval_batch_size=BATCH_SIZE,
        gradient_accumulation_steps=ACCUMULATION,
        num_train_epochs=2,
        learning_rate=0.01,
        logging_steps=1,
        eval_strategy="epoch",
        seed=7,
        **arguments,
    )
    trainer = recording_trainer(trainer_cls)(
        model=make_regression_mlp(),
        args=args,
        train_dataset=regression_data(NUM_TRAIN),
        eval_dataset=regression_data(NUM_EVAL, seed=1),
    )
    accelerator = trainer.accelerator
    tag = f"{side}_{'_'.join(f'{k}{v}' for k, v in sorted(arguments.items())) or 'plain'}"
    result: dict[str, Any] = {"at_init": trainer.at_init, "facts_before": _facts(accelerator)}
    result["collectives"] = _collectives(accelerator, out_dir, tag)
    result["prepared_loader"] = _prepared_loader(accelerator)
    result["models"] = _models(accelerator, trainer.model)
    trainer.train()
    result["train_records"] = trainer.records
    trainer.records = []
    result["facts_after"] = _facts(accelerator)
    # accelerate still reports the finished train loader here (docs/divergences.md): a gather outside any loop.
    result["gather_for_metrics_after_train"] = plain(accelerator.gather_for_metrics(torch.arange(3.0)))
    trainer.evaluate()
    result["eval_records"] = trainer.records
    result["unwrap_trained"] = accelerator.unwrap_model(trainer.model_wrapped) is trainer.model
    return result


if __name__ == "__main__":
    side, out_dir = sys.argv[1], sys.argv[2]
    outcome = report(side, out_dir)
    from tests.distributed.launching import write_rank_report
    from tests.distributed.teardown import end_worker

    write_rank_report(out_dir, side, outcome)
    end_worker()
