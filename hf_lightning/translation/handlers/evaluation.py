"""Registry entries: evaluation, metrics, saving, Hub, best model and resume, Seq2Seq generation.

The checkpoint on SIGTERM is served by `engine/jit_checkpoint.py` and `engine/signals.py`; the Hub fields are read
by `trainer/hub_methods.py`.
"""

from __future__ import annotations

from typing import Any

from hf_lightning.translation.handlers.core import (
    Context,
    Decision,
    FieldEntry,
    always,
    honoured,
    not_applicable,
    warned,
)


def _eval_strategy(field: str, value: Any, ctx: Context) -> Decision:
    if value == "no":
        return honoured("no evaluation during training")
    return honoured("facade: evaluation at optimizer-step boundaries / epoch ends, after logging (R6.1)")


def _during_training(how_landed: str) -> Any:
    """A field read only while evaluating during training."""

    def handler(field: str, value: Any, ctx: Context) -> Decision:
        if ctx.get("eval_strategy") == "no":
            return not_applicable("eval_strategy is 'no'")
        return honoured(how_landed)

    return handler


def _eval_steps(field: str, value: Any, ctx: Context) -> Decision:
    if ctx.get("eval_strategy") != "steps":
        return not_applicable("eval_strategy is not 'steps'")
    return _during_training("flow callback: evaluates when global_step % eval_steps == 0")(field, value, ctx)


# ------------------------------------------------------------------ saving


def _save_strategy(field: str, value: Any, ctx: Context) -> Decision:
    if value == "no":
        return honoured("no checkpoints during training")
    return honoured("facade: checkpoints at optimizer-step boundaries / epoch ends (CKPT-3.6)")


def _save_option(how_landed: str) -> Any:
    """A field read only when checkpoints are saved during training."""

    def handler(field: str, value: Any, ctx: Context) -> Decision:
        if ctx.get("save_strategy") == "no":
            return not_applicable("save_strategy is 'no'")
        return honoured(how_landed)

    return handler


# ------------------------------------------------------------------ hub


def _push_to_hub(field: str, value: Any, ctx: Context) -> Decision:
    if not value:
        return honoured("no Hub push")
    return honoured(
        "trainer/hub_methods.py: the repo is created in the constructor (token checked first), each save is pushed "
        "in the background per hub_strategy, push_to_hub() makes the final commit"
    )


def _hub_option(how: str) -> Any:
    """A hub_* field: read by trainer/hub_methods.py when push_to_hub is on."""

    def handler(field: str, value: Any, ctx: Context) -> Decision:
        if ctx.get("push_to_hub"):
            return honoured(f"trainer/hub_methods.py: {how}")
        return not_applicable("push_to_hub is off (also read by an explicit trainer.push_to_hub())")

    return handler


# ------------------------------------------------------------------ best model, resume


def _load_best_model_at_end(field: str, value: Any, ctx: Context) -> Decision:
    if not value:
        return honoured("the final model is the last one")
    return honoured("facade: reloads the best checkpoint after training")


def _best_metric_option(field: str, value: Any, ctx: Context) -> Decision:
    if value is None:
        return not_applicable("no metric chosen")
    return honoured(
        "facade: compares evaluation metrics (best checkpoint, load_best_model_at_end, metric-driven schedules)"
    )


def _enable_jit_checkpoint(field: str, value: Any, ctx: Context) -> Decision:
    if not value:
        return honoured("facade: SIGTERM ends the process as without a handler (exit status 143)")
    return honoured(
        "facade: on SIGTERM a checkpoint at the next update boundary, then train() returns "
        "(hf_lightning/engine/jit_checkpoint.py, hf_lightning/engine/signals.py)"
    )


# ------------------------------------------------------------------ seq2seq generation


def _generation_option() -> Any:
    """A Seq2Seq generation field: read by `HFLightningSeq2SeqTrainer` (the plain trainer ignores it, as the
    reference does)."""

    def handler(field: str, value: Any, ctx: Context) -> Decision:
        if field == "generation_config":
            if value is None:
                return not_applicable("the model's own generation_config is used")
            return honoured(
                "Seq2SeqTrainer: loaded (a GenerationConfig, a file or folder, or a model id; needs transformers) "
                "into model.generation_config at construction"
            )
        if field == "predict_with_generate":
            if not value:
                return not_applicable("evaluate()/predict() return the forward's outputs (no generate())")
            return honoured(
                "Seq2SeqTrainer: evaluate()/predict() return generate() tokens, padded with the pad id to the "
                "generation config's max_length; the loss is still reported"
            )
        if not ctx.get("predict_with_generate"):
            return not_applicable("predict_with_generate is False")
        if value is None:
            return not_applicable("not set: generate() uses model.generation_config")
        return honoured(
            "Seq2SeqTrainer: passed to generate() in evaluate()/predict() unless the call gives its own value"
        )

    return handler


def _sortish_sampler(field: str, value: Any, ctx: Context) -> Decision:
    if value:
        return warned("sortish_sampler has no effect (it has none in the reference 5.24 either)")
    return not_applicable("no effect in the reference 5.24")


ENTRIES: list[FieldEntry] = [
    FieldEntry("eval_strategy", "no", _eval_strategy, "evaluation during training"),
    FieldEntry("eval_steps", None, _eval_steps, "evaluation interval"),
    FieldEntry(
        "eval_delay",
        0,
        _during_training("flow callback: no evaluation before this step / epoch"),
        "first evaluation step / epoch",
    ),
    FieldEntry(
        "per_device_eval_batch_size",
        8,
        always("dataloaders.py: batch size of the eval / test dataloaders"),
        "eval dataloader batch size",
    ),
    FieldEntry(
        "prediction_loss_only",
        False,
        always("facade: evaluation returns only the loss"),
        "loss-only evaluation",
        carries=("evaluation", "prediction_loss_only"),
    ),
    FieldEntry(
        "eval_on_start",
        False,
        always("facade: one evaluation before the first update"),
        "evaluation before the first update",
        carries=("evaluation", "on_start"),
    ),
    FieldEntry(
        "eval_do_concat_batches",
        True,
        always("facade: predictions concatenated across batches"),
        "concatenate predictions",
        carries=("evaluation", "do_concat_batches"),
    ),
    FieldEntry(
        "eval_use_gather_object",
        False,
        always("facade: gathers arbitrary objects across processes"),
        "gather Python objects",
        carries=("evaluation", "use_gather_object"),
    ),
    FieldEntry(
        "eval_accumulation_steps",
        None,
        always(
            "facade: predictions moved to CPU every n eval steps; with a torchmetrics compute_metrics "
            "(hf_lightning/evaluation/metric_objects.py) evaluate() keeps no predictions, so only its losses are "
            "offloaded and the metric values do not depend on it; predict() offloads as with a callable"
        ),
        "offload predictions; with a torchmetrics `compute_metrics`, `evaluate()` keeps none (only losses offloaded)",
        carries=("evaluation", "accumulation_steps"),
    ),
    FieldEntry(
        "include_for_metrics",
        [],
        always(
            "facade: inputs / losses passed to a callable compute_metrics; with a torchmetrics object a non-empty "
            "value is refused at construction (at evaluate() / predict() when compute_metrics is assigned later)"
        ),
        "extra inputs of compute_metrics; refused with a torchmetrics `compute_metrics` (it gets predictions, labels)",
        carries=("evaluation", "include_for_metrics"),
    ),
    FieldEntry(
        "batch_eval_metrics",
        False,
        always(
            "facade: a callable compute_metrics called per batch; True with a torchmetrics object is refused at "
            "construction (at evaluate() / predict() when compute_metrics is assigned later): it is already updated "
            "per batch and computed once"
        ),
        "per-batch metrics; refused with a torchmetrics `compute_metrics` (already updated per batch)",
        carries=("evaluation", "batch_eval_metrics"),
    ),
    FieldEntry(
        "save_only_model",
        False,
        _save_option("checkpoint/checkpointer.py: model weights only, no optimizer, scheduler or RNG files"),
        "checkpoints without optimizer state",
        carries=("checkpointing", "save_only_model"),
    ),
    FieldEntry(
        "save_strategy",
        "steps",
        _save_strategy,
        "checkpoints during training, written atomically",
        carries=("checkpointing", "save_strategy"),
    ),
    FieldEntry(
        "save_steps",
        500,
        _save_option("flow callback: saves when global_step % save_steps == 0 and at the end"),
        "save interval",
    ),
    FieldEntry(
        "save_on_each_node",
        False,
        _save_option("checkpoint/checkpointer.py: local rank 0 of every node saves"),
        "which processes save",
    ),
    FieldEntry(
        "save_total_limit",
        None,
        _save_option("checkpoint/files.py rotate_checkpoints: rotation, keeping the best (CKPT-3.9)"),
        "checkpoint rotation",
        carries=("checkpointing", "save_total_limit"),
    ),
    FieldEntry(
        "enable_jit_checkpoint", False, _enable_jit_checkpoint, "checkpoint on SIGTERM"
    ),
    FieldEntry("push_to_hub", False, _push_to_hub, "Hub pushes: repo created at construction, each save pushed in the background, push_to_hub() at the end", carries=("hub", "push_to_hub")),
    FieldEntry(
        "hub_token", None, _hub_option("the token of every Hub call; never written to disk"),
        "token of every Hub call (else HF_TOKEN / the cached login), checked before training; never written",
    ),
    FieldEntry("hub_private_repo", None, _hub_option("visibility of the repo it creates"), "visibility of the repo the trainer creates", carries=("hub", "private_repo")),
    FieldEntry(
        "hub_model_id", None, _hub_option("the repo pushed to (default: the name of output_dir)"), "repo pushed to (default: the name of output_dir)",
        carries=("hub", "model_id"),
    ),
    FieldEntry(
        "hub_strategy", "every_save",
        _hub_option("what each save pushes (end, every_save, checkpoint, all_checkpoints)"), "what a save pushes: end, every_save, checkpoint (last-checkpoint/), all_checkpoints",
        carries=("hub", "strategy"),
    ),
    FieldEntry(
        "hub_always_push", False, _hub_option("a save pushes even while the previous push runs"),
        "a save pushes even while the previous push still runs",
        carries=("hub", "always_push"),
    ),
    FieldEntry("hub_revision", None, _hub_option("the branch every push commits to"), "branch every push commits to", carries=("hub", "revision")),
    FieldEntry(
        "load_best_model_at_end",
        False,
        _load_best_model_at_end,
        "reload the best checkpoint (needs evaluation and checkpoints)",
        carries=("checkpointing", "load_best_model_at_end"),
    ),
    FieldEntry(
        "metric_for_best_model",
        None,
        _best_metric_option,
        "metric that defines the best model",
        carries=("checkpointing", "metric_for_best_model"),
    ),
    FieldEntry(
        "greater_is_better", None, _best_metric_option, "direction of that metric",
        carries=("checkpointing", "greater_is_better"),
    ),
    FieldEntry(
        "ignore_data_skip",
        False,
        always(
            "resume.py: when True the resumed epoch restarts from its first batch (global_step continues); "
            "when False the batches already trained on are skipped at the sampler level and the RNG restored "
            "after the first window, as the reference does"
        ),
        "resume without skipping batches",
        carries=("checkpointing", "ignore_data_skip"),
    ),
    FieldEntry(
        "restore_callback_states_from_checkpoint",
        False,
        always(
            "resume.py: each stateful callback stored in trainer_state.json is rebuilt as cls(**args) with its "
            "attributes and appended after the others; the stored TrainerControl replaces trainer.control"
        ),
        "restore callbacks on resume",
        carries=("checkpointing", "restore_callback_states_from_checkpoint"),
    ),
]

SEQ2SEQ_ENTRIES: list[FieldEntry] = [
    FieldEntry(
        "sortish_sampler", False, _sortish_sampler, "no effect (as in the reference); warns when True"
    ),
    FieldEntry(
        "predict_with_generate",
        False,
        _generation_option(),
        "generate() in evaluate / predict",
    ),
    FieldEntry(
        "generation_max_length",
        None,
        _generation_option(),
        "`max_length` for generate()",
    ),
    FieldEntry(
        "generation_num_beams",
        None,
        _generation_option(),
        "`num_beams` for generate()",
    ),
    FieldEntry(
        "generation_config",
        None,
        _generation_option(),
        "GenerationConfig for generate()",
    ),
]
