"""What `trainer.accelerator` reports about the processes and the accumulation window, read from the run.

`DistributedType` has accelerate's member names and string values (a `str` enum), so a comparison with
accelerate's own `DistributedType.MULTI_GPU` (also a `str` enum) holds. The views read the facade each time:
before `train()` the launcher's values in `args` (what accelerate reports from construction), during and after a
run the Lightning strategy's.
"""

from __future__ import annotations

import enum
from typing import Any

import torch

from hf_lightning.engine.accelerator.ports import AcceleratorOwner
from hf_lightning.evaluation.helpers import last_batch_remainder
from hf_lightning.strategies.tensor_parallel.shards import trainer_tp_size


class DistributedType(str, enum.Enum):
    """accelerate's names for the kind of run (the members Lightning's strategies can be)."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"

    def __str__(self) -> str:
        return self.value


def lightning_strategy(trainer: AcceleratorOwner) -> Any:
    """The strategy of the facade's current (or last) `lightning.Trainer`; None before the first `train()`."""
    lightning_trainer = trainer.lightning_trainer
    return None if lightning_trainer is None else lightning_trainer.strategy


def num_processes(trainer: AcceleratorOwner) -> int:
    """Processes of the run: the strategy's world size, else the launcher's (`args.world_size`)."""
    strategy = lightning_strategy(trainer)
    return int(strategy.world_size) if strategy is not None else int(trainer.args.world_size)


def process_index(trainer: AcceleratorOwner) -> int:
    """This process's global rank: the strategy's, else the launcher's (`args.process_index`)."""
    strategy = lightning_strategy(trainer)
    return int(strategy.global_rank) if strategy is not None else int(trainer.args.process_index)


def local_process_index(trainer: AcceleratorOwner) -> int:
    """This process's rank on its node: the strategy's, else the launcher's (`args.local_process_index`)."""
    strategy = lightning_strategy(trainer)
    return int(strategy.local_rank) if strategy is not None else int(trainer.args.local_process_index)


def refuse_tensor_parallel_dealing(trainer: AcceleratorOwner, what: str) -> None:
    """Refuse dealing data by global rank in a tensor-parallel run, naming the field: its ranks are one replica and
    must see the same samples (different ones would feed each DTensor shard other inputs, silently)."""
    tp_size = trainer_tp_size(trainer)
    if tp_size > 1:
        raise NotImplementedError(
            f"trainer.accelerator.{what} with parallelism_config.tp_size={tp_size} is not supported yet by "
            "hf_lightning (it deals the data by global rank, but the tensor-parallel ranks must all see the same "
            "samples); set tp_size=1, or iterate the data unsplit on every rank"
        )


def distributed_type(trainer: AcceleratorOwner) -> DistributedType:
    """accelerate's kind of run for the plan's strategy (NO for a single process, as accelerate reports it)."""
    strategy = trainer.plan.strategy
    name = None if strategy is None else strategy.name
    if name == "deepspeed":
        return DistributedType.DEEPSPEED
    if name in ("fsdp", "fsdp2"):
        return DistributedType.FSDP
    if num_processes(trainer) <= 1:
        return DistributedType.NO
    return DistributedType.MULTI_GPU if trainer.args.device.type == "cuda" else DistributedType.MULTI_CPU


def mixed_precision(trainer: AcceleratorOwner) -> str:
    """The mixed precision, "bf16", "fp16" or "no": the precision the arguments ask for (`bf16` / `fp16`), as accelerate reports it."""
    args = trainer.args
    if getattr(args, "bf16", False):
        return "bf16"
    if getattr(args, "fp16", False):
        return "fp16"
    return "no"


def autocast_dtype(trainer: AcceleratorOwner) -> torch.dtype | None:
    """The dtype the model's forward autocasts to in this run (None: full precision, fp16 on CPU included)."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(trainer.plan.module.forward_autocast)


class AcceleratorStateView:
    """accelerate's `AcceleratorState` as far as it has a meaning here (read-only, from the facade)."""

    def __init__(self, trainer: AcceleratorOwner):
        self._trainer = trainer

    @property
    def device(self) -> torch.device:
        """The device this process computes on: `args.device`, indexed `cpu:0` with several CPU processes (as
        accelerate names it there)."""
        device = self._trainer.args.device
        if device.type == "cpu" and self.distributed_type == DistributedType.MULTI_CPU:
            return torch.device("cpu", 0)
        return device

    @property
    def num_processes(self) -> int:
        """Processes of the run."""
        return num_processes(self._trainer)

    @property
    def process_index(self) -> int:
        """This process's global rank."""
        return process_index(self._trainer)

    @property
    def local_process_index(self) -> int:
        """This process's rank on its node."""
        return local_process_index(self._trainer)

    @property
    def distributed_type(self) -> DistributedType:
        """accelerate's kind of run."""
        return distributed_type(self._trainer)

    @property
    def mixed_precision(self) -> str:
        """The mixed precision, "bf16", "fp16" or "no"."""
        return mixed_precision(self._trainer)

    @property
    def use_distributed(self) -> bool:
        """Whether the run is distributed (more than one process)."""
        return self.distributed_type != DistributedType.NO and self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        """Whether this is the global main process."""
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        """Whether this is the main process of its node."""
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        """Whether this is the process with the highest rank."""
        return self.process_index == self.num_processes - 1

    @property
    def deepspeed_plugin(self) -> None:
        """None: DeepSpeed is configured through `TrainingArguments.deepspeed` and run by Lightning's strategy."""
        return None

    @property
    def fsdp_plugin(self) -> None:
        """None: FSDP is configured through `TrainingArguments.fsdp` and run by Lightning's strategy."""
        return None

    @property
    def parallelism_config(self) -> Any:
        """The arguments' `parallelism_config` (None by default: no context / tensor parallelism)."""
        return getattr(self._trainer.args, "parallelism_config", None)

    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type}\nNum processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\nLocal process index: {self.local_process_index}\n"
            f"Device: {self.device}\nMixed precision type: {self.mixed_precision}\n"
        )


# accelerate's GradientAccumulationPlugin defaults, other than num_steps.
_ACCUMULATION_DEFAULTS = {"adjust_scheduler": True, "sync_with_dataloader": True, "sync_each_batch": False}


class DataLoaderConfigView:
    """accelerate's `DataLoaderConfiguration`: how batches are dealt to processes (the arguments'
    accelerator_config; read-only but for `even_batches`, which accelerate's accelerator also sets)."""

    def __init__(self, trainer: AcceleratorOwner):
        self._trainer = trainer

    @property
    def split_batches(self) -> bool:
        """Whether each batch is split across processes (else each process loads whole batches)."""
        return self._trainer.plan.module.split_batches

    @property
    def dispatch_batches(self) -> bool | None:
        """Whether batches are read on the main process and dispatched (None: accelerate's default)."""
        return self._trainer.plan.module.dispatch_batches

    @property
    def even_batches(self) -> bool:
        """Whether the last round is completed from the first samples so every process gets as many batches: the
        value last set (`accelerator.even_batches = ...`), else accelerator_config's."""
        chosen = self.__dict__.get("_even_batches")
        return self._trainer.plan.module.even_batches if chosen is None else chosen

    @property
    def use_seedable_sampler(self) -> bool:
        """Whether the random sampler is seeded per epoch (reproducible shuffling)."""
        return self._trainer.plan.module.use_seedable_sampler

    @property
    def non_blocking(self) -> bool:
        """Whether batches are copied to the device without blocking."""
        config = getattr(self._trainer.args, "accelerator_config", None)
        return bool(getattr(config, "non_blocking", False))

    @property
    def data_seed(self) -> int | None:
        """The arguments' `data_seed`."""
        return getattr(self._trainer.args, "data_seed", None)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "dispatch_batches" and not value:
            return  # each process loads its own batches already: nothing is dispatched
        if name == "even_batches":
            object.__setattr__(self, "_even_batches", bool(value))  # accelerate's only writable dealing option
            return
        if name != "_trainer":
            raise AttributeError(
                f"accelerator.dataloader_config.{name} is read-only under hf_lightning: the trainer builds its "
                f"dataloaders from TrainingArguments.accelerator_config; set accelerator_config={{'{name}': ...}}."
            )
        object.__setattr__(self, name, value)


class GradientStateView:
    """accelerate's `GradientState`: where the current micro-batch stands in its window and its dataloader.

    `sync_gradients` is whether the micro-batch closes its accumulation window (True outside training);
    `end_of_dataloader` / `remainder` describe the batch being evaluated (the facade's evaluation loop) or, in
    training, the train dataloader's last batch; `remainder` is -1 when unknown or outside a dataloader.
    """

    def __init__(self, trainer: AcceleratorOwner):
        self._trainer = trainer
        # Loaders from `accelerator.prepare(dataloader)` being iterated, innermost last (accelerate's stack).
        self.active_dataloaders: list[Any] = []

    @property
    def sync_gradients(self) -> bool:
        """Whether this micro-batch closes its accumulation window (the optimizer steps after it)."""
        run = self._trainer._training_run
        module = None if run is None else run.module
        return bool(module.sync_gradients) if module is not None else True

    @property
    def num_steps(self) -> int:
        """Micro-batches per update the accelerator itself accumulates: 1, as in the reference's accelerator
        (the trainer accumulates, `gradient_accumulation_steps`)."""
        return 1

    @property
    def plugin_kwargs(self) -> dict[str, Any]:
        """accelerate's non-default accumulation options: `num_steps` 1 and accelerator_config's
        `gradient_accumulation_kwargs` other than `num_steps` (folded into gradient_accumulation_steps)."""
        config = getattr(self._trainer.args, "accelerator_config", None)
        given = dict(getattr(config, "gradient_accumulation_kwargs", None) or {})
        kwargs: dict[str, Any] = {"num_steps": 1}
        for name, default in _ACCUMULATION_DEFAULTS.items():
            if name in given and given[name] != default:
                kwargs[name] = given[name]
        return kwargs

    @property
    def in_dataloader(self) -> bool:
        """Whether an evaluation or training dataloader is being iterated."""
        return self._position() is not None

    @property
    def end_of_dataloader(self) -> bool:
        """Whether the current batch is its dataloader's last."""
        position = self._position()
        return bool(position and position[0])

    @property
    def remainder(self) -> int:
        """Real samples of the last batch across processes (accelerate's `len(dataset) % total_batch_size`)."""
        position = self._position()
        return -1 if position is None else int(position[1])

    def _position(self) -> tuple[bool, int] | None:
        """(end_of_dataloader, remainder) of the innermost dataloader being iterated; None outside any.

        As accelerate, the remainder is known from the start of an iteration (the dataset length modulo the
        global batch), not only at its last batch.
        """
        if self.active_dataloaders:
            loader = self.active_dataloaders[-1]
            return loader.end_of_dataloader, loader.remainder

        trainer = self._trainer
        evaluation = trainer._current_evaluation
        if evaluation is not None and evaluation.iterating:
            if evaluation.on_last_batch:
                return True, int(evaluation.last_batch_remainder)
            eval_dataloader = getattr(trainer.callback_handler, "eval_dataloader", None)
            return False, last_batch_remainder(eval_dataloader, None, num_processes(trainer))
        run = trainer._training_run
        module = None if run is None else run.module
        if module is None or not run.fitting:
            return None
        remainder = last_batch_remainder(run.lightning_trainer.train_dataloader, None, num_processes(trainer))
        return bool(module.end_of_dataloader), remainder

    def __repr__(self) -> str:
        return (
            f"Sync Gradients: {self.sync_gradients}\nAt end of current dataloader: {self.end_of_dataloader}\n"
            f"Extra samples added: {self.remainder}\n"
        )
