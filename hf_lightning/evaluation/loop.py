"""`EvaluationLoop`: one pass of the reference's evaluation loop over a dataloader (EVAL-2.2 to EVAL-2.11).

It holds where the pass stands (on the last batch, that batch's real samples, iterating or not), which the gathers
read and `trainer.accelerator.gradient_state` reports, so no per-evaluation state sits on the facade. The facade's
reference-named methods (`evaluation_loop`, `prediction_step`, `_prepare_input`, `compute_metrics`,
`_gather_for_metrics`, ...; trainer/evaluation_methods.py) build it and are what it calls back, so subclass overrides run.
Cross-process gathering goes through torch.distributed (strategies/distributed.py); the process group is created on
first use when launched.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

import hf_lightning.strategies.distributed as distributed
from hf_lightning.core.autocast import autocast_forward
from hf_lightning.core.devices import empty_device_cache
from hf_lightning.core.outputs import EvalLoopOutput, EvalPrediction
from hf_lightning.data.sized import has_length
from hf_lightning.evaluation.helpers import (
    EvalLoopContainer,
    denumpify_detensorize,
    drop_last_batch_padding,
    find_batch_size,
    is_iterable_dataset_shard,
    iterate_with_last_flag,
    last_batch_remainder,
    loss_rows,
    spans_several_devices,
)
from hf_lightning.evaluation.metric_objects import local_rows_to_keep, streaming_metrics_for
from hf_lightning.strategies.for_evaluation import (
    check_evaluation_before_training,
    evaluation_replicas,
    tensor_parallel_size,
)

logger = logging.getLogger(__name__)


class EvaluationHooks(Protocol):
    """The trainer as one evaluation pass sees it: the reference's evaluation override points it calls back, the
    state it reports to the callbacks, and the model it prepares (timed once, `model_preparation_time`)."""

    args: Any  # TrainingArguments
    plan: Any  # translation.plan.Plan: its evaluation, logging and module sections
    deepspeed: Any  # the DeepSpeed engine of a run, else None
    model: nn.Module
    optimizer: Any  # None before training; a schedule-free optimizer has `eval()`
    state: Any  # callbacks.state.TrainerState
    control: Any  # callbacks.state.TrainerControl
    callback_handler: Any  # callbacks' CallbackHandler: on_prediction_step, eval_dataloader
    compute_metrics: Any  # Callable[[EvalPrediction], dict] | None
    preprocess_logits_for_metrics: Any  # Callable[[logits, labels], logits] | None
    is_in_train: bool
    _model_is_prepared: bool
    _telemetry: Any  # engine.telemetry.meter.TelemetryMeter, None when the telemetry is off

    def num_examples(self, dataloader: Any) -> int: ...
    def prediction_step(
        self, model: nn.Module, inputs: dict[str, Any], prediction_loss_only: bool, ignore_keys: list[str] | None = None
    ) -> tuple[Any, Any, Any]: ...
    def _prepare_input(self, data: Any) -> Any: ...
    def _gather_for_metrics(self, data: Any, is_loss: bool = False) -> Any: ...
    def _pad_across_processes(self, tensor: Any, dim: int = 1, pad_index: int = -100) -> Any: ...
    def _mixed_precision_dtype(self) -> torch.dtype | None: ...
    def get_tp_size(self) -> int: ...  # read by strategies/for_evaluation.py: the tensor-parallel ranks gather nothing


class EvaluationLoop:
    """One evaluation or prediction pass of `trainer` (the facade, through its evaluation hooks) over a dataloader."""

    def __init__(self, trainer: EvaluationHooks, drops_loss_padding: bool = True):
        self.trainer = trainer
        # The reference's `gather_function` is `gather_for_metrics`, which drops the last batch's padding samples;
        # Seq2SeqTrainer gathers its losses with a plain gather instead (the facade's `_gather_drops_padding`).
        self.drops_loss_padding = drops_loss_padding
        self.iterating = False
        # Whether the batch being evaluated is the last, and how many real samples it holds (-1: unknown).
        self.on_last_batch = False
        self.last_batch_remainder = -1

    def run(
        self,
        dataloader: Any,
        description: str,
        prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> EvalLoopOutput:
        """The loop shared by `evaluate()` ("Evaluation") and `predict()` ("Prediction"), with or without labels."""
        trainer = self.trainer
        args = trainer.args
        plan = trainer.plan
        prediction_loss_only = (
            prediction_loss_only if prediction_loss_only is not None else plan.evaluation.prediction_loss_only
        )

        self._prepare_distributed(dataloader)
        check_evaluation_before_training(plan, args, trainer.deepspeed)
        model = self._prepare_model()

        # Full fp16 / bf16 evaluation outside training casts the model itself (in place, as the reference).
        if not trainer.is_in_train:
            if plan.evaluation.fp16_full_eval:
                model = model.to(dtype=torch.float16, device=args.device)
            elif plan.evaluation.bf16_full_eval:
                model = model.to(dtype=torch.bfloat16, device=args.device)

        batch_size = args.eval_batch_size

        logger.info(f"\n***** Running {description} *****")
        if has_length(dataloader):
            logger.info(f"  Num examples = {trainer.num_examples(dataloader)}")
        else:
            logger.info("  Num examples: Unknown")
        logger.info(f"  Batch size = {batch_size}")

        if hasattr(model, "eval") and callable(model.eval):
            model.eval()
        if hasattr(trainer.optimizer, "eval") and callable(trainer.optimizer.eval):
            trainer.optimizer.eval()

        trainer.callback_handler.eval_dataloader = dataloader
        eval_dataset = getattr(dataloader, "dataset", None)

        all_losses = EvalLoopContainer(plan.evaluation.do_concat_batches, padding_index=-100)
        all_preds = EvalLoopContainer(plan.evaluation.do_concat_batches, padding_index=-100)
        all_labels = EvalLoopContainer(plan.evaluation.do_concat_batches, padding_index=-100)
        all_inputs = EvalLoopContainer(plan.evaluation.do_concat_batches, padding_index=-100)

        metrics = None
        eval_set_kwargs: dict[str, Any] = {}
        # Counted for datasets without a length.
        observed_num_examples = 0
        keep_results = not plan.evaluation.batch_eval_metrics or description == "Prediction"
        # A torchmetrics object is updated per batch: evaluate() then gathers and keeps no predictions.
        streaming = streaming_metrics_for(trainer.compute_metrics, plan.evaluation, tensor_parallel_size(trainer))
        streamed_any = False
        if streaming is not None:
            streaming.reset()
            keep_results = description == "Prediction"

        # The telemetry's count of this pass's samples and tokens (engine/telemetry/meter.py), None when not measured.
        telemetry = trainer._telemetry
        measured = None if telemetry is None or telemetry.current_pass is None else telemetry.current_pass.counter
        self.iterating = True  # `trainer.accelerator.gradient_state` reports this loop's dataloader meanwhile
        try:
            with autocast_forward(model, args.device.type, trainer._mixed_precision_dtype()):
                for step, (inputs, is_last_batch) in enumerate(iterate_with_last_flag(dataloader)):
                    # The reference's prepared dataloader yields batches already on the device.
                    inputs = trainer._prepare_input(inputs)
                    self.on_last_batch = is_last_batch
                    if is_last_batch:
                        self.last_batch_remainder = last_batch_remainder(dataloader, inputs, self.replicas())
                    if measured is not None:
                        measured.count(inputs)
                    observed_batch_size = find_batch_size(inputs)
                    if observed_batch_size is not None:
                        observed_num_examples += observed_batch_size
                        # With a batch sampler the dataloader's batch size is unknown in advance.
                        if batch_size is None:
                            batch_size = observed_batch_size

                    losses, logits, labels = trainer.prediction_step(
                        model, inputs, prediction_loss_only, ignore_keys=ignore_keys
                    )
                    main_input_name = getattr(trainer.model, "main_input_name", "input_ids")
                    inputs_decode = (
                        trainer._prepare_input(inputs[main_input_name])
                        if "inputs" in plan.evaluation.include_for_metrics
                        else None
                    )

                    if losses is not None:
                        # One entry per sample so that the mean is sample-weighted (EVAL-2.9).
                        rows = loss_rows(dataloader, batch_size, observed_batch_size)
                        losses = trainer._gather_for_metrics(losses.repeat(rows), is_loss=True)
                        all_losses.add(losses)
                    if inputs_decode is not None:
                        inputs_decode = trainer._pad_across_processes(inputs_decode, dim=1, pad_index=-100)
                        inputs_decode = trainer._gather_for_metrics(inputs_decode)
                        if keep_results:
                            all_inputs.add(inputs_decode)
                    streamed = None
                    if streaming is not None and logits is not None and labels is not None:
                        streamed = self.update_streaming_metrics(streaming, logits, labels)
                        streamed_any = True
                        if not keep_results:
                            logits = labels = None
                    if labels is not None:
                        # Padded before `preprocess_logits_for_metrics` sees them.
                        labels = trainer._pad_across_processes(labels, dim=1, pad_index=-100)
                    if logits is not None:
                        logits = trainer._pad_across_processes(logits, dim=1, pad_index=-100)
                        if streamed is not None and not distributed.is_distributed():
                            # One process: no padding across processes, so the metric's input is the same.
                            logits = streamed
                        elif trainer.preprocess_logits_for_metrics is not None:
                            logits = trainer.preprocess_logits_for_metrics(logits, labels)
                        logits = trainer._gather_for_metrics(logits)
                        if keep_results:
                            all_preds.add(logits)
                    if labels is not None:
                        labels = trainer._gather_for_metrics(labels)
                        if keep_results:
                            all_labels.add(labels)

                    trainer.control = trainer.callback_handler.on_prediction_step(args, trainer.state, trainer.control)

                    if plan.evaluation.batch_eval_metrics:
                        if trainer.compute_metrics is not None and logits is not None and labels is not None:
                            batch_kwargs = {
                                "losses": losses if "loss" in plan.evaluation.include_for_metrics else None,
                                "inputs": inputs if "inputs" in plan.evaluation.include_for_metrics else None,
                            }
                            metrics = trainer.compute_metrics(
                                EvalPrediction(predictions=logits, label_ids=labels, **batch_kwargs),
                                compute_result=is_last_batch,
                            )
                        del losses, logits, labels, inputs
                        empty_device_cache()
                    elif (
                        plan.evaluation.accumulation_steps is not None
                        and (step + 1) % plan.evaluation.accumulation_steps == 0
                    ):
                        # Free device memory: move what was gathered so far to numpy.
                        all_losses.to_cpu_and_numpy()
                        all_preds.to_cpu_and_numpy()
                        all_labels.to_cpu_and_numpy()
                        all_inputs.to_cpu_and_numpy()
                        del losses, logits, labels, inputs
                        empty_device_cache()
        finally:
            self.iterating = False
            self.on_last_batch = False
            self.last_batch_remainder = -1

        all_losses = all_losses.get_arrays()
        all_preds = all_preds.get_arrays()
        all_labels = all_labels.get_arrays()
        all_inputs = all_inputs.get_arrays()

        num_samples = self._count_samples(dataloader, eval_dataset, observed_num_examples)

        if streaming is not None:
            # Every process computes: torchmetrics syncs the states across them.
            metrics = streaming.compute() if streamed_any else {}
        elif (
            trainer.compute_metrics is not None
            and all_preds is not None
            and all_labels is not None
            and not plan.evaluation.batch_eval_metrics
        ):
            eval_set_kwargs["losses"] = all_losses if "loss" in plan.evaluation.include_for_metrics else None
            eval_set_kwargs["inputs"] = all_inputs if "inputs" in plan.evaluation.include_for_metrics else None
            metrics = trainer.compute_metrics(
                EvalPrediction(predictions=all_preds, label_ids=all_labels, **eval_set_kwargs)
            )
        elif metrics is None:
            metrics = {}

        # JSON-serialisable values: no numpy scalars or one-element tensors.
        metrics = denumpify_detensorize(metrics)

        losses = np.concatenate(all_losses) if isinstance(all_losses, list) and all_losses else all_losses
        if isinstance(losses, np.ndarray):
            finite = np.isfinite(losses)
            if plan.logging.nan_inf_filter and finite.any():
                losses = losses[finite]
            metrics[f"{metric_key_prefix}_loss"] = losses.mean().item()
        if hasattr(trainer, "model_preparation_time"):
            metrics[f"{metric_key_prefix}_model_preparation_time"] = trainer.model_preparation_time

        # Prefix every key; renamed keys move to the end of the dict (EVAL-2.11).
        for key in list(metrics.keys()):
            if not key.startswith(f"{metric_key_prefix}_"):
                metrics[f"{metric_key_prefix}_{key}"] = metrics.pop(key)

        return EvalLoopOutput(
            predictions=all_preds, label_ids=all_labels, metrics=metrics, num_samples=num_samples
        )

    def gather_for_metrics(self, data: Any, is_loss: bool = False) -> Any:
        """Gather `data` from every process (rank order) and drop the last batch's padding samples.

        As accelerate's `gather_for_metrics`: the last batch is cut to its real sample count, which makes
        `eval_loss` sample-weighted and removes the samples the distributed sampler repeated to even out the
        last round. Non-tensor data (or `eval_use_gather_object=True`) is gathered as Python objects.
        `drops_loss_padding=False` (Seq2SeqTrainer's `_gather_drops_padding`) keeps the losses uncut, as the reference does; the
        predictions, labels and inputs are always cut, so they hold exactly one row per sample
        (docs/divergences.md).
        """
        if distributed.is_distributed() and not self._one_replica():
            if self.trainer.plan.evaluation.use_gather_object or not distributed.all_tensors(data):
                data = distributed.gather_object(data)
            else:
                data = distributed.gather(data)
        if is_loss and not self.drops_loss_padding:
            return data
        return drop_last_batch_padding(data, self.on_last_batch, self.last_batch_remainder)

    def pad_across_processes(self, tensor: Any, dim: int = 1, pad_index: int = -100) -> Any:
        """Pad `tensor` on `dim` with `pad_index` to the widest of all processes; identity in a single process."""
        if distributed.is_distributed() and self._one_replica():  # nothing is gathered
            return tensor
        return distributed.pad_across_processes(tensor, dim=dim, pad_index=pad_index)

    def replicas(self) -> int:
        """The processes that evaluate different samples: the data-parallel replicas (the tensor-parallel ranks of
        a replica see the same batches, so a tensor-parallel run over every process gathers nothing)."""
        return evaluation_replicas(self.trainer)

    def _one_replica(self) -> bool:
        """Whether several processes form one replica: each holds every sample's results."""
        return getattr(self.trainer.args, "world_size", 1) > 1 and self.replicas() == 1

    def _prepare_distributed(self, dataloader: Any) -> None:
        """Create the process group when launched with several processes (evaluate() may precede train())."""
        if distributed.ensure_process_group(self.trainer.args):
            distributed.check_even_eval_shards(
                self.trainer.args, getattr(dataloader, "dataset", None), settings=self.trainer.plan.module
            )

    def _prepare_model(self) -> nn.Module:
        """The model evaluation runs; the first time, before any training, it is moved to the device and timed.

        The reference prepares the model with accelerate when evaluate/predict comes before `train()` and keeps
        the time as `model_preparation_time` (seconds, 4 decimals; never unset).
        """
        trainer = self.trainer
        model = trainer.model
        if trainer.is_in_train:
            # `train()` has prepared the model already: nothing to time (the reference's accelerator holds it).
            trainer._model_is_prepared = True
        if not trainer._model_is_prepared:
            start_time = time.time()
            if not spans_several_devices(model):
                model = model.to(trainer.args.device)
            trainer.model_preparation_time = round(time.time() - start_time, 4)
            trainer._model_is_prepared = True
        return model

    def update_streaming_metrics(self, streaming: Any, logits: Any, labels: Any) -> Any:
        """Update a torchmetrics `compute_metrics` with this process's batch; return what the metric received.

        The predictions are `preprocess_logits_for_metrics(logits, labels)` when given, else the logits, unpadded
        and on their device; labels as the collator made them (-100 included: the metric's `ignore_index`
        decides). On the last batch the rows the distributed sampler repeated are left out, so every sample
        updates the metric exactly once across processes.
        """
        predictions = logits
        if self.trainer.preprocess_logits_for_metrics is not None:
            predictions = self.trainer.preprocess_logits_for_metrics(logits, labels)
        batch_rows = find_batch_size(labels)
        rows = None
        if batch_rows is not None:
            rank = torch.distributed.get_rank() if distributed.is_distributed() else 0
            rows = local_rows_to_keep(
                batch_rows, self.on_last_batch, self.last_batch_remainder, rank
            )
        streaming.update(predictions, labels, rows)
        return predictions

    def _count_samples(self, dataloader: Any, eval_dataset: Any, observed_num_examples: int) -> int:
        """`num_samples` of the loop (EVAL-2.10): dataset length, shard count, dataloader estimate, or observed."""
        if has_length(eval_dataset):
            num_samples = len(eval_dataset)
        elif getattr(eval_dataset, "num_examples", 0) > 0 and is_iterable_dataset_shard(eval_dataset):
            num_samples = eval_dataset.num_examples
        elif has_length(dataloader):
            num_samples = self.trainer.num_examples(dataloader)
        else:
            num_samples = observed_num_examples
        if num_samples == 0 and observed_num_examples > 0:
            num_samples = observed_num_examples
        return num_samples
