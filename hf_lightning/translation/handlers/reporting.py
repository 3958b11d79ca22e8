"""Registry entries: logging during training and experiment tracking (R1.1, R6.9)."""

from __future__ import annotations

from typing import Any

from hf_lightning.translation.handlers.core import (
    Context,
    Decision,
    FieldEntry,
    always,
    honoured,
    not_applicable,
    refused,
)
from hf_lightning.translation.logger_specs import (
    logger_specs,
    reference_integrations,
    report_to_of,
    requested_loggers,
)


def _logging_steps(field: str, value: Any, ctx: Context) -> Decision:
    if ctx.get("logging_strategy") != "steps":
        return not_applicable("logging_strategy is not 'steps'")
    return honoured(
        "flow callback: logs when global_step % logging_steps == 0; a ratio < 1 is resolved at train start"
    )


def _log_on_each_node(field: str, value: Any, ctx: Context) -> Decision:
    if ctx.env.num_nodes > 1:
        return honoured("facade: should_log is local rank 0 of each node if True, else global rank 0")
    return not_applicable("one node: rank 0 logs with either value")


def _include_num_input_tokens_seen(field: str, value: Any, ctx: Context) -> Decision:
    # the reference's __post_init__ maps bools; duck-typed arguments may still hold one
    mode = {True: "all", False: "no"}.get(value, value) if isinstance(value, bool) else value
    if mode == "no":
        return honoured("no token counting", module={"include_num_input_tokens_seen": "no"})
    if mode not in ("all", "non_padding"):
        return refused("expected 'all', 'non_padding' or 'no'")
    return honoured(
        f"HFLightningModule: counts {'every' if mode == 'all' else 'non-padding'} input token; tokens/s logged",
        module={"include_num_input_tokens_seen": mode},
    )


def _disable_tqdm(field: str, value: Any, ctx: Context) -> Decision:
    if value:
        return honoured("facade: each log dict is printed (Lightning's own progress bar stays off)")
    return honoured("facade: tqdm bar over update steps on rank 0 (Lightning's own progress bar stays off)")


def _report_to(field: str, value: Any, ctx: Context) -> Decision:
    try:
        specs = logger_specs(ctx.args, ctx.env)
        callbacks = reference_integrations(report_to_of(ctx.args, ctx.env), ctx.env)
    except ValueError as error:
        return refused(str(error))
    if not specs and not callbacks:
        return honoured("no experiment tracker")
    carriers = []
    if callbacks:
        carriers.append(
            f"transformers' own integration callbacks ({', '.join(callbacks)}) run by our callback system, "
            "recording what the reference records"
        )
    if specs:
        names = ", ".join(spec["name"] for spec in specs)
        carriers.append(
            f"Lightning loggers ({names}) fed from log_history with each backend's reference key convention "
            "(train/, eval/, test/ prefixes; MLflow unprefixed)"
        )
    return honoured("; ".join(carriers), loggers=tuple(specs), logging={"integrations": tuple(callbacks)})


def _run_name(field: str, value: Any, ctx: Context) -> Decision:
    try:
        requested = requested_loggers(report_to_of(ctx.args, ctx.env), ctx.env)
    except ValueError:
        requested = []  # report_to's own note carries the refusal
    if not requested:
        return not_applicable("read by experiment trackers; none is in use")
    return honoured("given to the experiment trackers (their integration callbacks or Lightning loggers)")


def _trackio_field(field: str, value: Any, ctx: Context) -> Decision:
    try:
        callbacks = reference_integrations(report_to_of(ctx.args, ctx.env), ctx.env)
    except ValueError:
        callbacks = []  # report_to's own note carries the refusal
    if "trackio" in callbacks:
        return honoured("read by transformers' TrackioCallback (report_to='trackio')")
    return not_applicable("read by the Trackio integration only, which report_to does not name")


ENTRIES: list[FieldEntry] = [
    FieldEntry(
        "logging_strategy",
        "steps",
        always("flow callback: training logs at optimizer-step boundaries or epoch ends (R6.1)"),
        "when training logs are written",
    ),
    FieldEntry("logging_steps", 500, _logging_steps, "logging interval (int or ratio)"),
    FieldEntry(
        "logging_first_step",
        False,
        always("flow callback: also logs after update 1 when True"),
        "log after the first update",
    ),
    FieldEntry("log_on_each_node", True, _log_on_each_node, "which processes log"),
    FieldEntry(
        "logging_nan_inf_filter",
        True,
        always("HFLightningModule: NaN/Inf micro-losses replaced in the logged average when True (R6.3)"),
        "NaN/Inf filter of the logged loss",
        carries=("logging", "nan_inf_filter"),
    ),
    FieldEntry("include_num_input_tokens_seen", "no", _include_num_input_tokens_seen, "token counting"),
    FieldEntry(
        "log_level",
        "passive",
        always("facade: verbosity of the main process's hf_lightning (and transformers) loggers"),
        "main-process verbosity",
    ),
    FieldEntry(
        "log_level_replica",
        "warning",
        always("facade: verbosity of the other processes"),
        "replica verbosity",
    ),
    FieldEntry("disable_tqdm", None, _disable_tqdm, "progress bar or printed logs"),
    FieldEntry(
        "report_to",
        "none",
        _report_to,
        "the reference's twelve integrations through its own callbacks (transformers installed), else Lightning "
        "loggers for tensorboard, mlflow, wandb, comet_ml; csv (ours) through Lightning's CSVLogger",
    ),
    FieldEntry("run_name", None, _run_name, "run name for the loggers"),
    FieldEntry("project", "huggingface", _trackio_field, "Trackio's project (report_to='trackio')"),
    FieldEntry("trackio_space_id", None, _trackio_field, "Trackio's Space (report_to='trackio')"),
    FieldEntry("trackio_bucket_id", None, _trackio_field, "Trackio's bucket (report_to='trackio')"),
    FieldEntry("trackio_static_space_id", None, _trackio_field, "Trackio's static Space (report_to='trackio')"),
]
