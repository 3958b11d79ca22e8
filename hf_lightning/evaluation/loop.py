"""`evaluate`, `predict` and their loop, as in transformers' `Trainer` (EVAL-2.1 to EVAL-2.17).

`EvaluationMixin` is mixed into the `HFLightningTrainer` facade. It runs in the facade's process, outside
Lightning's loops, so evaluation during training happens at the optimizer-step boundaries the facade
chooses. Cross-process gathering goes through `_gather_for_metrics` / `_pad_across_processes`
(torch.distributed, see `distributed.py`); the process group is created on first use when launched.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np
import torch
from torch import nn

import hf_lightning.strategies.distributed as distributed
from hf_lightning.core.autocast import autocast_forward, planned_autocast_dtype
from hf_lightning.core.devices import empty_device_cache, is_out_of_memory
from hf_lightning.core.outputs import EvalLoopOutput, EvalPrediction, PredictionOutput
from hf_lightning.data.sized import has_length
from hf_lightning.evaluation.helpers import (
    EvalLoopContainer,
    deepspeed_input_dtype,
    denumpify_detensorize,
    drop_last_batch_padding,
    find_batch_size,
    is_iterable_dataset_shard,
    is_metric_driven_scheduler,
    iterate_with_last_flag,
    last_batch_remainder,
    loss_rows,
    nested_detach,
    spans_several_devices,
    speed_metrics,
)
from hf_lightning.evaluation.metric_objects import local_rows_to_keep, streaming_metrics_for
from hf_lightning.integrations.logger_adapters import publish_predict_metrics
from hf_lightning.strategies.fsdp.policies import is_fsdp2_model
from hf_lightning.strategies.tensor_parallel.state import trainer_tp_size

logger = logging.getLogger(__name__)


class EvaluationMixin:
    """The reference Trainer's evaluation and prediction methods, for the facade to inherit.

    Relies on the facade's reference-named attributes (`args`, `model`, `state`, `control`,
    `callback_handler`, `label_names`, `compute_metrics`, `compute_loss`, `log`, ...). The facade's `train()`
    must set `_model_is_prepared = True`: evaluation before any training then records
    `model_preparation_time` exactly once, as the reference does when accelerate has no prepared model.
    """

    # Set by `train()` once the engine has prepared the model; evaluate/predict set it when they prepare it.
    _model_is_prepared: bool = False
    # The reference's `gather_function` is `gather_for_metrics`, which drops the last batch's padding samples;
    # Seq2SeqTrainer sets it to a plain gather before evaluating. Setting this to False does the same, for one
    # `evaluation_loop` (which resets it, like the reference resets `gather_function`).
    _gather_drops_padding: bool = True
    # Where the current evaluation loop stands: whether it is on the last batch, and how many samples that
    # batch holds (-1: unknown). Read by `_gather_for_metrics`.
    _eval_on_last_batch: bool = False
    _eval_last_batch_remainder: int = -1
    _eval_in_loop: bool = False  # True while `evaluation_loop` iterates (trainer.accelerator.gradient_state)

    # ----------------------------------------------------------------------------------------------------
    # public API
    # ----------------------------------------------------------------------------------------------------

    def evaluate(
        self,
        eval_dataset: Any = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> dict[str, float]:
        """Run the evaluation loop on `eval_dataset` (or `self.eval_dataset`), log and return the metrics.

        A dict of datasets is evaluated one by one with `metric_key_prefix=f"{prefix}_{name}"` and the results
        merged. The result holds `epoch` because `log()` adds it to the same dict.
        """
        override = eval_dataset is not None
        eval_dataset = eval_dataset if override else self.eval_dataset
        if isinstance(eval_dataset, dict):
            metrics: dict[str, float] = {}
            for eval_dataset_name, _eval_dataset in eval_dataset.items():
                dataset_metrics = self.evaluate(
                    eval_dataset=_eval_dataset if override else eval_dataset_name,
                    ignore_keys=ignore_keys,
                    metric_key_prefix=f"{metric_key_prefix}_{eval_dataset_name}",
                )
                metrics.update(dataset_metrics)
            return metrics

        memory_tracker = getattr(self, "_memory_tracker", None)
        if memory_tracker is not None:
            memory_tracker.start()

        eval_dataloader = self.get_eval_dataloader(eval_dataset)
        start_time = time.time()
        output = self.evaluation_loop(
            eval_dataloader,
            description="Evaluation",
            # No point gathering predictions without metrics; otherwise `args.prediction_loss_only` decides.
            prediction_loss_only=True if self.compute_metrics is None else None,
            ignore_keys=ignore_keys,
            metric_key_prefix=metric_key_prefix,
        )
        self._add_speed_metrics(output, metric_key_prefix, start_time)

        self.log(output.metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, output.metrics)
        if memory_tracker is not None:
            memory_tracker.stop_and_update_metrics(output.metrics)
        return output.metrics

    def predict(
        self, test_dataset: Any, ignore_keys: list[str] | None = None, metric_key_prefix: str = "test"
    ) -> PredictionOutput:
        """Run the prediction loop on `test_dataset`: predictions, labels (if any) and metrics.

        Unlike `evaluate`, nothing is logged (no `epoch` key, `log_history` unchanged); `on_predict` fires.
        Predictions of different widths are padded with -100 on dim 1.
        """
        memory_tracker = getattr(self, "_memory_tracker", None)
        if memory_tracker is not None:
            memory_tracker.start()

        test_dataloader = self.get_test_dataloader(test_dataset)
        start_time = time.time()
        output = self.evaluation_loop(
            test_dataloader,
            description="Prediction",
            ignore_keys=ignore_keys,
            metric_key_prefix=metric_key_prefix,
        )
        self._add_speed_metrics(output, metric_key_prefix, start_time)

        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, output.metrics)
        publish_predict_metrics(
            self._current_loggers(), output.metrics, self.state.global_step, self.state.epoch
        )
        if memory_tracker is not None:
            memory_tracker.stop_and_update_metrics(output.metrics)
        return PredictionOutput(
            predictions=output.predictions, label_ids=output.label_ids, metrics=output.metrics
        )

    def evaluation_loop(
        self,
        dataloader: Any,
        description: str,
        prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> EvalLoopOutput:
        """The loop shared by `evaluate()` ("Evaluation") and `predict()` ("Prediction"), with or without labels."""
        args = self.args
        prediction_loss_only = (
            prediction_loss_only if prediction_loss_only is not None else args.prediction_loss_only
        )

        self._prepare_distributed_evaluation(dataloader)
        self._check_deepspeed_evaluation_before_train()
        model = self._prepare_model_for_evaluation()

        # Full fp16 / bf16 evaluation outside training casts the model itself (in place, as the reference).
        if not self.is_in_train:
            if args.fp16_full_eval:
                model = model.to(dtype=torch.float16, device=args.device)
            elif args.bf16_full_eval:
                model = model.to(dtype=torch.bfloat16, device=args.device)

        batch_size = args.eval_batch_size

        logger.info(f"\n***** Running {description} *****")
        if has_length(dataloader):
            logger.info(f"  Num examples = {self.num_examples(dataloader)}")
        else:
            logger.info("  Num examples: Unknown")
        logger.info(f"  Batch size = {batch_size}")

        if hasattr(model, "eval") and callable(model.eval):
            model.eval()
        if hasattr(self.optimizer, "eval") and callable(self.optimizer.eval):
            self.optimizer.eval()

        self.callback_handler.eval_dataloader = dataloader
        eval_dataset = getattr(dataloader, "dataset", None)

        all_losses = EvalLoopContainer(args.eval_do_concat_batches, padding_index=-100)
        all_preds = EvalLoopContainer(args.eval_do_concat_batches, padding_index=-100)
        all_labels = EvalLoopContainer(args.eval_do_concat_batches, padding_index=-100)
        all_inputs = EvalLoopContainer(args.eval_do_concat_batches, padding_index=-100)

        metrics = None
        eval_set_kwargs: dict[str, Any] = {}
        # Counted for datasets without a length.
        observed_num_examples = 0
        keep_results = not args.batch_eval_metrics or description == "Prediction"
        # A torchmetrics object is updated per batch: evaluate() then gathers and keeps no predictions.
        streaming = streaming_metrics_for(self.compute_metrics, args, trainer_tp_size(self))
        streamed_any = False
        if streaming is not None:
            streaming.reset()
            keep_results = description == "Prediction"

        self._eval_on_last_batch = False
        # `trainer.accelerator.gradient_state` reports this loop's dataloader while it runs.
        self._eval_in_loop = True
        try:
            with autocast_forward(model, args.device.type, self._mixed_precision_dtype()):
                for step, (inputs, is_last_batch) in enumerate(iterate_with_last_flag(dataloader)):
                    # The reference's prepared dataloader yields batches already on the device.
                    inputs = self._prepare_input(inputs)
                    self._eval_on_last_batch = is_last_batch
                    if is_last_batch:
                        self._eval_last_batch_remainder = last_batch_remainder(
                            dataloader, inputs, self._eval_replicas()
                        )
                    observed_batch_size = find_batch_size(inputs)
                    if observed_batch_size is not None:
                        observed_num_examples += observed_batch_size
                        # With a batch sampler the dataloader's batch size is unknown in advance.
                        if batch_size is None:
                            batch_size = observed_batch_size

                    losses, logits, labels = self.prediction_step(
                        model, inputs, prediction_loss_only, ignore_keys=ignore_keys
                    )
                    main_input_name = getattr(self.model, "main_input_name", "input_ids")
                    inputs_decode = (
                        self._prepare_input(inputs[main_input_name])
                        if "inputs" in args.include_for_metrics
                        else None
                    )

                    if losses is not None:
                        # One entry per sample so that the mean is sample-weighted (EVAL-2.9).
                        rows = loss_rows(dataloader, batch_size, observed_batch_size)
                        losses = self._gather_for_metrics(losses.repeat(rows), is_loss=True)
                        all_losses.add(losses)
                    if inputs_decode is not None:
                        inputs_decode = self._pad_across_processes(inputs_decode, dim=1, pad_index=-100)
                        inputs_decode = self._gather_for_metrics(inputs_decode)
                        if keep_results:
                            all_inputs.add(inputs_decode)
                    streamed = None
                    if streaming is not None and logits is not None and labels is not None:
                        streamed = self._update_streaming_metrics(streaming, logits, labels)
                        streamed_any = True
                        if not keep_results:
                            logits = labels = None
                    if labels is not None:
                        # Padded before `preprocess_logits_for_metrics` sees them.
                        labels = self._pad_across_processes(labels, dim=1, pad_index=-100)
                    if logits is not None:
                        logits = self._pad_across_processes(logits, dim=1, pad_index=-100)
                        if streamed is not None and not distributed.is_distributed():
                            # One process: no padding across processes, so the metric's input is the same.
                            logits = streamed
                        elif self.preprocess_logits_for_metrics is not None:
                            logits = self.preprocess_logits_for_metrics(logits, labels)
                        logits = self._gather_for_metrics(logits)
                        if keep_results:
                            all_preds.add(logits)
                    if labels is not None:
                        labels = self._gather_for_metrics(labels)
                        if keep_results:
                            all_labels.add(labels)

                    self.control = self.callback_handler.on_prediction_step(args, self.state, self.control)

                    if args.batch_eval_metrics:
                        if self.compute_metrics is not None and logits is not None and labels is not None:
                            batch_kwargs = {
                                "losses": losses if "loss" in args.include_for_metrics else None,
                                "inputs": inputs if "inputs" in args.include_for_metrics else None,
                            }
                            metrics = self.compute_metrics(
                                EvalPrediction(predictions=logits, label_ids=labels, **batch_kwargs),
                                compute_result=is_last_batch,
                            )
                        del losses, logits, labels, inputs
                        empty_device_cache()
                    elif (
                        args.eval_accumulation_steps is not None
                        and (step + 1) % args.eval_accumulation_steps == 0
                    ):
                        # Free device memory: move what was gathered so far to numpy.
                        all_losses.to_cpu_and_numpy()
                        all_preds.to_cpu_and_numpy()
                        all_labels.to_cpu_and_numpy()
                        all_inputs.to_cpu_and_numpy()
                        del losses, logits, labels, inputs
                        empty_device_cache()
        finally:
            self._gather_drops_padding = True
            self._eval_in_loop = False
            self._eval_on_last_batch = False
            self._eval_last_batch_remainder = -1

        all_losses = all_losses.get_arrays()
        all_preds = all_preds.get_arrays()
        all_labels = all_labels.get_arrays()
        all_inputs = all_inputs.get_arrays()

        num_samples = self._count_eval_samples(dataloader, eval_dataset, observed_num_examples)

        if streaming is not None:
            # Every process computes: torchmetrics syncs the states across them.
            metrics = streaming.compute() if streamed_any else {}
        elif (
            self.compute_metrics is not None
            and all_preds is not None
            and all_labels is not None
            and not args.batch_eval_metrics
        ):
            eval_set_kwargs["losses"] = all_losses if "loss" in args.include_for_metrics else None
            eval_set_kwargs["inputs"] = all_inputs if "inputs" in args.include_for_metrics else None
            metrics = self.compute_metrics(
                EvalPrediction(predictions=all_preds, label_ids=all_labels, **eval_set_kwargs)
            )
        elif metrics is None:
            metrics = {}

        # JSON-serialisable values: no numpy scalars or one-element tensors.
        metrics = denumpify_detensorize(metrics)

        losses = np.concatenate(all_losses) if isinstance(all_losses, list) and all_losses else all_losses
        if isinstance(losses, np.ndarray):
            finite = np.isfinite(losses)
            if args.logging_nan_inf_filter and finite.any():
                losses = losses[finite]
            metrics[f"{metric_key_prefix}_loss"] = losses.mean().item()
        if hasattr(self, "model_preparation_time"):
            metrics[f"{metric_key_prefix}_model_preparation_time"] = self.model_preparation_time

        # Prefix every key; renamed keys move to the end of the dict (EVAL-2.11).
        for key in list(metrics.keys()):
            if not key.startswith(f"{metric_key_prefix}_"):
                metrics[f"{metric_key_prefix}_{key}"] = metrics.pop(key)

        return EvalLoopOutput(
            predictions=all_preds, label_ids=all_labels, metrics=metrics, num_samples=num_samples
        )

    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, torch.Tensor | Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """One evaluation step: `(loss, logits, labels)`, each None when not available (EVAL-2.3).

        The loss is computed when every label name is in `inputs`, or, for models without label names, when
        `return_loss` (input, else `can_return_loss`) is true. Labels are taken before the forward because
        `compute_loss` may pop them.
        """
        has_labels = (
            False if len(self.label_names) == 0 else all(inputs.get(k) is not None for k in self.label_names)
        )
        # CLIP-like models return a loss without labels when `return_loss` is true.
        return_loss = inputs.get("return_loss")
        if return_loss is None:
            return_loss = self.can_return_loss
        loss_without_labels = len(self.label_names) == 0 and return_loss

        inputs = self._prepare_inputs(inputs)
        if ignore_keys is None:
            if hasattr(self.model, "config"):
                ignore_keys = getattr(self.model.config, "keys_to_ignore_at_inference", ["cache"])
            else:
                ignore_keys = []

        if has_labels or loss_without_labels:
            labels = nested_detach(tuple(inputs.get(name) for name in self.label_names))
            if len(labels) == 1:
                labels = labels[0]
        else:
            labels = None

        with torch.no_grad():
            if has_labels or loss_without_labels:
                num_items_in_batch = self._get_num_items_in_batch([inputs], self.args.device)
                with self.compute_loss_context_manager():
                    if getattr(self.args, "use_liger_kernel", False) and prediction_loss_only:
                        inputs = {**inputs, "skip_logits": True}
                    loss, outputs = self.compute_loss(
                        model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch
                    )
                loss = loss.detach().mean()
                if isinstance(outputs, dict):
                    logits = tuple(v for k, v in outputs.items() if k not in ignore_keys + ["loss"])
                else:
                    logits = outputs[1:]
            else:
                loss = None
                with self.compute_loss_context_manager():
                    outputs = model(**inputs)
                if isinstance(outputs, dict):
                    logits = tuple(v for k, v in outputs.items() if k not in ignore_keys)
                else:
                    logits = outputs

        if prediction_loss_only:
            return (loss, None, None)

        logits = nested_detach(logits)
        if len(logits) == 1:
            logits = logits[0]
        return (loss, logits, labels)

    def _evaluate(
        self, trial: Any, ignore_keys_for_eval: list[str] | None, skip_scheduler: bool = False
    ) -> dict[str, float]:
        """Evaluate during training, report to the HP search and step a plateau-type scheduler."""
        try:
            metrics = self.evaluate(ignore_keys=ignore_keys_for_eval)
        except RuntimeError as error:
            # `auto_find_batch_size` only shrinks the train batch; letting an eval OOM through would make it
            # restart training with ever smaller train batches.
            if getattr(self.args, "auto_find_batch_size", False) and is_out_of_memory(error):
                raise RuntimeError(
                    "Evaluation hit an out-of-memory error. `auto_find_batch_size` only adjusts the training batch "
                    "size, reduce `per_device_eval_batch_size` instead."
                ) from error
            raise
        self._report_evaluation_to_hp_search(trial, metrics)

        if is_metric_driven_scheduler(self.lr_scheduler) and not skip_scheduler:
            metric_to_check = self.args.metric_for_best_model
            if not metric_to_check.startswith("eval_"):
                metric_to_check = f"eval_{metric_to_check}"
            try:
                self.lr_scheduler.step(metrics[metric_to_check])
            except KeyError as exc:
                raise KeyError(
                    f"The `metric_for_best_model` training argument is set to '{metric_to_check}', "
                    f"which is not found in the evaluation metrics. "
                    f"The available evaluation metrics are: {list(metrics.keys())}. "
                    f"Please ensure that the `compute_metrics` function returns a dictionary that includes "
                    f"'{metric_to_check}' or consider changing the `metric_for_best_model` via the TrainingArguments."
                ) from exc
        return metrics

    # ----------------------------------------------------------------------------------------------------
    # hooks for the distributed and HP-search work, and small steps of the loop
    # ----------------------------------------------------------------------------------------------------

    def _update_streaming_metrics(self, streaming: Any, logits: Any, labels: Any) -> Any:
        """Update a torchmetrics `compute_metrics` with this process's batch; return what the metric received.

        The predictions are `preprocess_logits_for_metrics(logits, labels)` when given, else the logits, unpadded
        and on their device; labels as the collator made them (-100 included: the metric's `ignore_index`
        decides). On the last batch the rows the distributed sampler repeated are left out, so every sample
        updates the metric exactly once across processes.
        """
        predictions = logits
        if self.preprocess_logits_for_metrics is not None:
            predictions = self.preprocess_logits_for_metrics(logits, labels)
        batch_rows = find_batch_size(labels)
        rows = None
        if batch_rows is not None:
            rank = torch.distributed.get_rank() if distributed.is_distributed() else 0
            rows = local_rows_to_keep(
                batch_rows, self._eval_on_last_batch, self._eval_last_batch_remainder, rank
            )
        streaming.update(predictions, labels, rows)
        return predictions

    def _gather_for_metrics(self, data: Any, is_loss: bool = False) -> Any:
        """Gather `data` from every process (rank order) and drop the last batch's padding samples.

        As accelerate's `gather_for_metrics`: the last batch is cut to its real sample count, which makes
        `eval_loss` sample-weighted and removes the samples the distributed sampler repeated to even out the
        last round. Non-tensor data (or `eval_use_gather_object=True`) is gathered as Python objects.
        `_gather_drops_padding = False` (Seq2SeqTrainer) keeps the losses uncut, as the reference does; the
        predictions, labels and inputs are always cut, so they hold exactly one row per sample
        (docs/divergences.md).
        """
        if distributed.is_distributed() and not self._one_tensor_parallel_replica():
            if getattr(self.args, "eval_use_gather_object", False) or not distributed.all_tensors(data):
                data = distributed.gather_object(data)
            else:
                data = distributed.gather(data)
        if is_loss and not self._gather_drops_padding:
            return data
        return drop_last_batch_padding(data, self._eval_on_last_batch, self._eval_last_batch_remainder)

    def _pad_across_processes(self, tensor: Any, dim: int = 1, pad_index: int = -100) -> Any:
        """Pad `tensor` on `dim` with `pad_index` to the widest of all processes; identity in a single process."""
        if distributed.is_distributed() and self._one_tensor_parallel_replica():  # nothing is gathered
            return tensor
        return distributed.pad_across_processes(tensor, dim=dim, pad_index=pad_index)

    def _eval_replicas(self) -> int:
        """The processes that evaluate different samples: all of them, except that the tensor-parallel ranks of
        a replica see the same batches, so a tensor-parallel run over every process gathers nothing."""
        return max(1, getattr(self.args, "world_size", 1) // trainer_tp_size(self))

    def _one_tensor_parallel_replica(self) -> bool:
        """Whether every process is a tensor-parallel rank of one replica: each holds every sample's results."""
        return trainer_tp_size(self) > 1 and self._eval_replicas() == 1

    def _prepare_distributed_evaluation(self, dataloader: Any) -> None:
        """Create the process group when launched with several processes (evaluate() may precede train())."""
        if distributed.ensure_process_group(self.args):
            distributed.check_even_eval_shards(
                self.args, getattr(dataloader, "dataset", None), settings=self.plan.module
            )

    def _report_evaluation_to_hp_search(self, trial: Any, metrics: dict[str, float]) -> None:
        """Hand the evaluation metrics to the HP-search trial, through the facade's `_report_to_hp_search`."""
        report = getattr(self, "_report_to_hp_search", None)
        if report is not None:
            report(trial, self.state.global_step, metrics)
        elif trial is not None:
            raise ValueError(
                f"trial={trial!r} was given but this trainer has no `_report_to_hp_search`; run hyperparameter "
                "search through `hyperparameter_search()` of a trainer that supports it."
            )

    def _prepare_model_for_evaluation(self) -> nn.Module:
        """The model evaluation runs; the first time, before any training, it is moved to the device and timed.

        The reference prepares the model with accelerate when evaluate/predict comes before `train()` and keeps
        the time as `model_preparation_time` (seconds, 4 decimals; never unset).
        """
        model = self.model
        if self.is_in_train:
            # `train()` has prepared the model already: nothing to time (the reference's accelerator holds it).
            self._model_is_prepared = True
        if not self._model_is_prepared:
            start_time = time.time()
            if not spans_several_devices(model):
                model = model.to(self.args.device)
            self.model_preparation_time = round(time.time() - start_time, 4)
            self._model_is_prepared = True
        return model

    def _mixed_precision_dtype(self) -> torch.dtype | None:
        """The autocast dtype of `fp16` / `bf16` mixed precision (the reference autocasts the forward), else None.

        None under DeepSpeed: the engine holds the model in its dtype and accelerate does not autocast its forward;
        `_prepare_input` casts float inputs to that dtype instead, as the reference does. None for a model FSDP2
        sharded (in training): its mixed precision is the sharding's `MixedPrecisionPolicy`, and accelerate
        prepares FSDP2 models without a forward autocast. An unsharded model (evaluate before train) keeps the
        autocast: the reference shards it with that policy for evaluation, which also computes in low precision.
        """
        if getattr(self, "is_deepspeed_enabled", False) or is_fsdp2_model(self.model):
            return None
        return planned_autocast_dtype(self.plan.module)

    def _check_deepspeed_evaluation_before_train(self) -> None:
        """evaluate / predict under DeepSpeed before any `train()` built the engine (`self.deepspeed is None`).

        The reference then builds a ZeRO inference engine (`deepspeed_init(inference=True)`), which it refuses below
        ZeRO-3. hf_lightning builds no inference engine: at ZeRO-3 the plain model gives the engine's results only
        when the config keeps float32 (the engine would cast the model to bf16 / fp16), so a 16-bit config is refused.
        """
        if not getattr(self, "is_deepspeed_enabled", False) or getattr(self, "deepspeed", None) is not None:
            return
        stage = self.plan.strategy.deepspeed.zero_stage
        if stage != 3:
            raise ValueError(
                "ZeRO inference only makes sense with ZeRO Stage 3 - please adjust your config "
                f"(evaluate() / predict() before train() with deepspeed zero_optimization.stage={stage}: the "
                "reference refuses it too; call train() first, or evaluate with a ZeRO-3 config or without deepspeed)"
            )
        dtype = deepspeed_input_dtype(self.args)
        if dtype != torch.float32:
            raise ValueError(
                f"evaluate() / predict() before train() under DeepSpeed ZeRO-3 with a {dtype} config "
                f"({'bf16' if dtype == torch.bfloat16 else 'fp16'}.enabled=true): the reference evaluates a "
                "ZeRO inference engine holding the model in that dtype, which hf_lightning does not build yet. Call "
                "train() first, evaluate with the 16-bit section disabled, or evaluate without deepspeed."
            )

    def _add_speed_metrics(self, output: EvalLoopOutput, metric_key_prefix: str, start_time: float) -> None:
        """Add runtime and throughput; the model preparation time is not counted as evaluation time."""
        total_batch_size = self.args.eval_batch_size * self.args.world_size
        if f"{metric_key_prefix}_model_preparation_time" in output.metrics:
            start_time += output.metrics[f"{metric_key_prefix}_model_preparation_time"]
        output.metrics.update(
            speed_metrics(
                metric_key_prefix,
                start_time,
                num_samples=output.num_samples,
                num_steps=math.ceil(output.num_samples / total_batch_size),
            )
        )

    def _count_eval_samples(self, dataloader: Any, eval_dataset: Any, observed_num_examples: int) -> int:
        """`num_samples` of the loop (EVAL-2.10): dataset length, shard count, dataloader estimate, or observed."""
        if has_length(eval_dataset):
            num_samples = len(eval_dataset)
        elif getattr(eval_dataset, "num_examples", 0) > 0 and is_iterable_dataset_shard(eval_dataset):
            num_samples = eval_dataset.num_examples
        elif has_length(dataloader):
            num_samples = self.num_examples(dataloader)
        else:
            num_samples = observed_num_examples
        if num_samples == 0 and observed_num_examples > 0:
            num_samples = observed_num_examples
        return num_samples
