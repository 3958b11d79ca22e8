"""The facade's evaluation methods with the reference's names: `evaluate`, `predict`, `evaluation_loop`,
`prediction_step`, `_evaluate` (EVAL-2.1 to EVAL-2.17).

`EvaluationMixin` is mixed into the `HFLightningTrainer` facade. Evaluation runs in the facade's process, outside
Lightning's loops, so evaluation during training happens at the optimizer-step boundaries the facade chooses. Each
`evaluation_loop` call is one `EvaluationLoop` pass (evaluation/loop.py), which owns the pass's state and calls back
the override points here.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import torch
from torch import nn

from hf_lightning.core.blocked_time import blocked_by
from hf_lightning.core.devices import is_out_of_memory
from hf_lightning.core.outputs import EvalLoopOutput, PredictionOutput
from hf_lightning.evaluation.helpers import is_metric_driven_scheduler, nested_detach, speed_metrics
from hf_lightning.evaluation.loop import EvaluationLoop
from hf_lightning.integrations.loggers import publish_predict_metrics
from hf_lightning.strategies.for_evaluation import evaluation_autocast_dtype

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
    # The evaluation pass running now (evaluation/loop.py), None between passes: the gathers and
    # `trainer.accelerator.gradient_state` read where it stands.
    _current_evaluation: EvaluationLoop | None = None

    def _read_changed_arguments(self) -> None:
        """The facade translates arguments changed since its plan was made (trainer/trainer.py); nothing here."""

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
        self._read_changed_arguments()  # what a script set on `args` since the plan was made is read
        if self._training_run is not None:  # during train(): not beside the held gradients (engine/held_gradients.py)
            self._training_run.release_held_gradients()
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

        with blocked_by(self, "evaluation"):  # the telemetry's evaluation share of a training run
            self._memory_tracker.start()

            eval_dataloader = self.get_eval_dataloader(eval_dataset)
            start_time = time.time()
            measured = _begin_pass(self._telemetry, "evaluate", metric_key_prefix)
            output = self.evaluation_loop(
                eval_dataloader,
                description="Evaluation",
                # No point gathering predictions without metrics; otherwise
                # `plan.evaluation.prediction_loss_only` decides.
                prediction_loss_only=True if self.compute_metrics is None else None,
                ignore_keys=ignore_keys,
                metric_key_prefix=metric_key_prefix,
            )
            self._add_speed_metrics(output, metric_key_prefix, start_time)
            if measured is not None:  # samples/s and tokens/s (engine/telemetry/meter.py)
                self._telemetry.end_pass(measured, output.metrics, output.num_samples)

            self.log(output.metrics)
            self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, output.metrics)
            self._memory_tracker.stop_and_update_metrics(output.metrics)
            return output.metrics

    def predict(
        self, test_dataset: Any, ignore_keys: list[str] | None = None, metric_key_prefix: str = "test"
    ) -> PredictionOutput:
        """Run the prediction loop on `test_dataset`: predictions, labels (if any) and metrics.

        Unlike `evaluate`, nothing is logged (no `epoch` key, `log_history` unchanged); `on_predict` fires.
        Predictions of different widths are padded with -100 on dim 1.
        """
        self._read_changed_arguments()
        with blocked_by(self, "evaluation"):  # the telemetry's evaluation share of a training run
            self._memory_tracker.start()

            test_dataloader = self.get_test_dataloader(test_dataset)
            start_time = time.time()
            measured = _begin_pass(self._telemetry, "predict", metric_key_prefix)
            output = self.evaluation_loop(
                test_dataloader,
                description="Prediction",
                ignore_keys=ignore_keys,
                metric_key_prefix=metric_key_prefix,
            )
            self._add_speed_metrics(output, metric_key_prefix, start_time)
            if measured is not None:  # samples/s and tokens/s (engine/telemetry/meter.py)
                self._telemetry.end_pass(measured, output.metrics, output.num_samples)

            self.control = self.callback_handler.on_predict(self.args, self.state, self.control, output.metrics)
            publish_predict_metrics(
                self._current_loggers(), output.metrics, self.state.global_step, self.state.epoch
            )
            self._memory_tracker.stop_and_update_metrics(output.metrics)
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
        """The loop shared by `evaluate()` ("Evaluation") and `predict()` ("Prediction"), with or without labels:
        one `EvaluationLoop` pass, which calls back `prediction_step` and the other override points."""
        loop = EvaluationLoop(self, drops_loss_padding=self._gather_drops_padding)
        outer, self._current_evaluation = self._current_evaluation, loop
        try:
            return loop.run(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        finally:
            self._current_evaluation = outer
            self._gather_drops_padding = True

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
        self._report_to_hp_search(trial, self.state.global_step, metrics)

        if is_metric_driven_scheduler(self.lr_scheduler) and not skip_scheduler:
            metric_to_check = self.plan.checkpointing.metric_for_best_model
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

    # ----------------------------------------------------------------------------------------------------
    # the running pass's gathers, and the steps around the loop
    # ----------------------------------------------------------------------------------------------------

    def _gather_for_metrics(self, data: Any, is_loss: bool = False) -> Any:
        """Gather `data` from every process (rank order) and drop the running pass's last-batch padding samples, as
        accelerate's `gather_for_metrics` (evaluation/loop.py's `EvaluationLoop.gather_for_metrics`)."""
        return self._current_evaluation.gather_for_metrics(data, is_loss=is_loss)

    def _pad_across_processes(self, tensor: Any, dim: int = 1, pad_index: int = -100) -> Any:
        """Pad `tensor` on `dim` with `pad_index` to the widest of all processes; identity in a single process."""
        return self._current_evaluation.pad_across_processes(tensor, dim=dim, pad_index=pad_index)

    def _mixed_precision_dtype(self) -> torch.dtype | None:
        """The autocast dtype of the evaluation forward (fp16 / bf16 mixed precision), as the strategy allows it."""
        return evaluation_autocast_dtype(self.plan, self.model)

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


def _begin_pass(telemetry: Any, kind: str, prefix: str) -> Any:
    """The telemetry's measurement of this evaluate() / predict() call (its loop counts the batches), None when off
    (`telemetry`: the facade's `TelemetryMeter`, None when off)."""
    return None if telemetry is None else telemetry.begin_pass(kind, prefix)
