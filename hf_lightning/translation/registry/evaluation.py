"""Registry entries: evaluation, metrics, saving, Hub, best model and resume, Seq2Seq generation.

Hub support and the checkpoint on SIGTERM have not landed (see `registry/features.py`): until then a
value of theirs that would change what `train()` does is refused, and the defaults are accepted.
"""

from __future__ import annotations

from typing import Any

from hf_lightning.translation.registry.core import (
    Context,
    Decision,
    FieldEntry,
    always,
    equals,
    gated,
    honoured,
    not_applicable,
    not_landed_message,
    refused,
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

_HUB_FIX = (
    "save locally and upload with huggingface_hub "
    "(HfApi().upload_folder(folder_path=output_dir, repo_id=...))"
)


def _hub_option(default: Any) -> Any:
    """Any non-default hub_* value asks for Hub behaviour."""

    def handler(field: str, value: Any, ctx: Context) -> Decision:
        if ctx.landed("hub"):
            if ctx.get("push_to_hub"):
                return honoured("facade: used when pushing to the Hub")
            return not_applicable("push_to_hub is off")
        if value == default:
            return not_applicable("Hub support has not landed yet (see push_to_hub)")
        return refused(not_landed_message("hub", _HUB_FIX))

    return handler


def _hub_token(field: str, value: Any, ctx: Context) -> Decision:
    if ctx.landed("hub") and ctx.get("push_to_hub"):
        return honoured("facade: Hub credentials (never written to disk)")
    return not_applicable("only used for Hub pushes; never written to disk")


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
        "(hf_lightning/engine/signals.py)"
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
    ),
    FieldEntry(
        "eval_on_start",
        False,
        always("facade: one evaluation before the first update"),
        "evaluation before the first update",
    ),
    FieldEntry(
        "eval_do_concat_batches",
        True,
        always("facade: predictions concatenated across batches"),
        "concatenate predictions",
    ),
    FieldEntry(
        "eval_use_gather_object",
        False,
        always("facade: gathers arbitrary objects across processes"),
        "gather Python objects",
    ),
    FieldEntry(
        "eval_accumulation_steps",
        None,
        always("facade: predictions moved to CPU every n eval steps"),
        "offload predictions",
    ),
    FieldEntry(
        "include_for_metrics",
        [],
        always("facade: inputs / losses passed to compute_metrics"),
        "extra inputs of compute_metrics",
    ),
    FieldEntry(
        "batch_eval_metrics",
        False,
        always("facade: compute_metrics called per batch"),
        "per-batch metrics",
    ),
    FieldEntry(
        "save_only_model",
        False,
        _save_option("checkpoint/saving.py: model weights only"),
        "checkpoints without optimizer state",
    ),
    FieldEntry(
        "save_strategy",
        "steps",
        _save_strategy,
        "checkpoints during training, written atomically",
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
        _save_option("checkpoint/saving.py: local rank 0 of every node saves"),
        "which processes save",
    ),
    FieldEntry(
        "save_total_limit",
        None,
        _save_option("checkpoint/saving.py: rotation, keeping the best (CKPT-3.9)"),
        "checkpoint rotation",
    ),
    FieldEntry(
        "enable_jit_checkpoint", False, _enable_jit_checkpoint, "checkpoint on SIGTERM"
    ),
    FieldEntry(
        "push_to_hub",
        False,
        gated(
            "hub",
            is_neutral=equals(False),
            how_landed="facade: pushes to the Hub per hub_strategy",
            how_neutral="no Hub push",
            fix=_HUB_FIX,
        ),
        "Hub pushes (refused until Hub support lands)",
        feature="hub",
    ),
    FieldEntry("hub_token", None, _hub_token, "Hub token; never written to disk"),
    FieldEntry("hub_private_repo", None, _hub_option(None), "Hub repo visibility", feature="hub"),
    FieldEntry("hub_model_id", None, _hub_option(None), "Hub repo id", feature="hub"),
    FieldEntry("hub_strategy", "every_save", _hub_option("every_save"), "when to push", feature="hub"),
    FieldEntry("hub_always_push", False, _hub_option(False), "push even if a push is running", feature="hub"),
    FieldEntry("hub_revision", None, _hub_option(None), "Hub branch / revision", feature="hub"),
    FieldEntry(
        "load_best_model_at_end",
        False,
        _load_best_model_at_end,
        "reload the best checkpoint (needs evaluation and checkpoints)",
    ),
    FieldEntry(
        "metric_for_best_model",
        None,
        _best_metric_option,
        "metric that defines the best model",
    ),
    FieldEntry(
        "greater_is_better", None, _best_metric_option, "direction of that metric"
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
    ),
    FieldEntry(
        "restore_callback_states_from_checkpoint",
        False,
        always(
            "resume.py: each stateful callback stored in trainer_state.json is rebuilt as cls(**args) with its "
            "attributes and appended after the others; the stored TrainerControl replaces trainer.control"
        ),
        "restore callbacks on resume",
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
