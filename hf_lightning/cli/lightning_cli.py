"""`hf-lightning fit | validate | test | predict --config run.yaml`: Trainer runs configured the LightningCLI way.

Built on jsonargparse directly, not on `LightningCLI`: that class needs a LightningModule and builds
`lightning.Trainer` from its own section, while here the facade builds both from TrainingArguments. What is
reused is jsonargparse's machinery that LightningCLI stands on: `class_path` / `init_args` for any class or
factory function, several `--config` files (later wins), dotted command-line overrides, `--print_config`.

Config sections: `trainer_class` (the facade class; a `HFLightningSeq2SeqTrainer` subclass makes `args`
Seq2SeqTrainingArguments), `args` (TrainingArguments fields), `model` (an `nn.Module` class or a function returning
one), `data` (a LightningDataModule or a `cli_data.DataSource`), `trainer` (native lightning.Trainer arguments that
take precedence; `lightning_bridge.SAFE_LIGHTNING_OVERRIDES`) and `ckpt_path`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hf_lightning.args.training_args import Seq2SeqTrainingArguments, TrainingArguments
from hf_lightning.cli.open_keywords import CONFIG_OPTIONS, MissingPackageError, load_config, route_argv
from hf_lightning.cli.quick_help import args_help, quick_help
from hf_lightning.core.heavy_imports import import_lightning
from hf_lightning.integrations.plotting import save_training_plot

if TYPE_CHECKING:
    from hf_lightning.trainer.trainer import HFLightningTrainer

SUBCOMMANDS: dict[str, str] = {
    "fit": "train (train()), save the model, then evaluate when there is eval data",
    "validate": "evaluate() on the eval data",
    "test": "predict() on the test data, with metrics",
    "predict": "predict() on the predict (else test) data; predictions go to output_dir",
}
# Seq2SeqTrainingArguments fields that a plain trainer class does not take.
SEQ2SEQ_ONLY_FIELDS = (
    "sortish_sampler",
    "predict_with_generate",
    "generation_max_length",
    "generation_num_beams",
    "generation_config",
)
_DATA_HINT = (
    "a `data:` class must be a LightningDataModule or declare train_dataset, eval_dataset, test_dataset and "
    "data_collator in its class body (annotations suffice; see hf_lightning.cli_data.DataSource)"
)


class CLIConfigError(ValueError):
    """A bad run config: reported as `hf-lightning COMMAND: error: ...` with exit code 2."""


@dataclass
class RunConfig:
    """One command's resolved config: built arguments, model, data and Lightning overrides."""

    command: str
    trainer_class: type
    args: Any
    model: Any
    data: Any
    lightning_overrides: dict[str, Any]
    ckpt_path: str | None


@dataclass
class CLIRun:
    """What one command did: its trainer, its metrics and the files it wrote."""

    command: str
    trainer: HFLightningTrainer  # the config's `trainer_class`
    metrics: dict[str, Any] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)


# ---- the parser --------------------------------------------------------------------------------------------------


def build_parser() -> Any:
    """The jsonargparse parser: one subcommand per entry of SUBCOMMANDS, all with the same sections."""
    from jsonargparse import ArgumentParser

    # lazy: the console script answers --help and `explain` before torch, Lightning or jsonargparse load
    from hf_lightning.cli.help_text import HelpFormatter

    parser = ArgumentParser(
        prog="hf-lightning",
        description="Run a Hugging Face Trainer configuration on PyTorch Lightning's engine.",
        exit_on_error=False,
        allow_abbrev=False,  # `--args.learning_rat` is a typo to report, not `--args.learning_rate`
        formatter_class=HelpFormatter,
    )
    subcommands = parser.add_subcommands(required=True, dest="subcommand")
    for name, help_text in SUBCOMMANDS.items():
        subcommands.add_subcommand(name, _subcommand_parser(name, help_text), help=help_text)
    return parser


def _subcommand_parser(name: str, help_text: str) -> Any:
    from typing import Optional, Union

    from jsonargparse import ActionConfigFile, ArgumentParser
    from torch import nn

    pl = import_lightning()  # before the modules below import it, so that it loads without full collections
    # lazy: the console script answers --help and `explain` before torch, Lightning or jsonargparse load
    from hf_lightning.cli.data_sources import DataSource
    from hf_lightning.cli.help_text import HelpFormatter, describe_dataclass_options
    from hf_lightning.engine.lightning_bridge import SAFE_LIGHTNING_OVERRIDES
    from hf_lightning.trainer.trainer import HFLightningTrainer

    parser = ArgumentParser(
        prog=f"hf-lightning {name}",
        # One line instead of argparse's list of all ~130 options (they are described below it).
        usage=(
            f"hf-lightning {name} [-h] [-c CONFIG] [--print_config] [--args.FIELD VALUE ...] --model CLASS_PATH "
            "--data CLASS_PATH [--trainer.KEY VALUE ...] [--trainer_class CLASS_PATH] [--ckpt_path PATH]"
        ),
        description=help_text,
        exit_on_error=False,
        allow_abbrev=False,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "-c",
        "--config",
        action=ActionConfigFile,
        help="a YAML / JSON run config; repeat it to layer files (later wins)",
    )
    parser.add_argument(
        "--trainer_class",
        type=type[HFLightningTrainer],
        default=HFLightningTrainer,
        help="the trainer class (a subclass of HFLightningSeq2SeqTrainer makes args Seq2SeqTrainingArguments)",
    )
    parser.add_class_arguments(Seq2SeqTrainingArguments, "args", instantiate=False, sub_configs=True)
    describe_dataclass_options(parser, Seq2SeqTrainingArguments, "args")
    parser.add_argument(
        "--model",
        type=nn.Module,
        required=True,
        help="class_path of an nn.Module or of a function returning one",
    )
    parser.add_argument(
        "--data",
        type=Union[pl.LightningDataModule, DataSource],  # noqa: UP007 (jsonargparse resolves typing.Union)
        required=True,
        help="class_path of a LightningDataModule or of a class following hf_lightning.cli_data.DataSource",
    )
    parser.add_argument(
        "--trainer",
        type=dict,
        default={},
        help=(
            "native lightning.Trainer arguments, taking precedence over the translation of args; keys: "
            f"{', '.join(SAFE_LIGHTNING_OVERRIDES)} (a later config file replaces the whole section)"
        ),
    )
    ckpt_help = (
        "resume from this checkpoint folder ('last': the newest in output_dir)"
        if name == "fit"
        else "load the model weights of this checkpoint-N folder (or 'last' / 'best' of output_dir)"
    )
    parser.add_argument("--ckpt_path", type=Optional[str], default=None, help=ckpt_help)  # noqa: UP045
    return parser


def importable_working_folder() -> None:
    """Put the working folder first on `sys.path`, as `python -m` and `python main.py` do, so a config's
    `class_path: mydata.CountingData` finds `mydata.py` next to it (the console script's own folder is the
    first entry otherwise)."""
    folder = os.getcwd()
    if "" not in sys.path and folder not in sys.path:
        sys.path.insert(0, folder)


def parse(argv: list[str]) -> tuple[str, Any, Any]:
    """Parse `argv` (`COMMAND --config ...`); returns the command, its subparser and its namespace."""
    from argparse import ArgumentError

    importable_working_folder()
    parser = build_parser()
    prog = f"hf-lightning {argv[0]}" if argv and argv[0] in SUBCOMMANDS else "hf-lightning"
    if argv and argv[0] in SUBCOMMANDS:
        _check_sections(argv, parser._subcommands_action._name_parser_map[argv[0]])
    try:
        argv = route_argv(argv, warn=lambda message: print(f"{prog}: warning: {message}", file=sys.stderr))
    except MissingPackageError as error:
        raise CLIConfigError(str(error)) from None
    try:
        config = parser.parse_args(argv)
    except ArgumentError as error:
        command = argv[0] if argv and argv[0] in SUBCOMMANDS else None
        message = str(error)
        if 'Parser key "data"' in message:
            message += f"\n  ({_DATA_HINT})"
        if command is not None:
            message += _suggestion(message, parser._subcommands_action._name_parser_map[command])
        raise CLIConfigError(message) from None
    command = config.subcommand
    subparser = parser._subcommands_action._name_parser_map[command]
    return command, subparser, config[command]


def _suggestion(message: str, subparser: Any) -> str:
    """`; did you mean 'args.learning_rate'?` for an unknown option close to a known one ('' otherwise)."""
    import difflib
    import re

    known = [key for key in subparser.get_defaults().keys() if key != "config"]
    option = re.search(r"unrecognized arguments: --([^\s=]+)", message)
    if option is not None:
        close = difflib.get_close_matches(option.group(1), known, n=1)
        return f"; did you mean '--{close[0]}'?" if close else ""
    unknown = re.search(r"does not accept option '([^']+)'", message)
    if unknown is None:
        return ""
    close = difflib.get_close_matches(unknown.group(1), known, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _check_sections(argv: list[str], subparser: Any) -> None:
    """Refuse a top-level key of a `--config` file that is no section (jsonargparse would drop it silently)."""
    import difflib

    sections = sorted({key.split(".")[0] for key in subparser.get_defaults().keys()} - {"config"})
    for index, token in enumerate(argv):
        option, has_inline, inline = token.partition("=")
        if option not in CONFIG_OPTIONS or (not has_inline and index + 1 >= len(argv)):
            continue
        source = inline if has_inline else argv[index + 1]
        config = load_config(source)
        for key in config if isinstance(config, dict) else ():
            if key not in sections:
                close = difflib.get_close_matches(str(key), sections, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                where = source if os.path.isfile(source) else "the --config text"
                raise CLIConfigError(
                    f"{where}: unknown top-level key {key!r}; {hint}(sections: {', '.join(sections)})"
                )


def resolve(command: str, subparser: Any, config: Any) -> RunConfig:
    """Build the arguments, seed as the reference's scripts do, then instantiate model, data and overrides."""
    # lazy: the console script answers --help and `explain` before torch, Lightning or jsonargparse load
    from hf_lightning.core.seeding import seed_from_args

    trainer_class = config.trainer_class
    args = _build_training_arguments(subparser, config, trainer_class)
    lightning_overrides = _lightning_overrides(config.trainer or {})
    seed_from_args(args)  # before the model is built, so its initial weights follow args.seed
    try:
        instantiated = subparser.instantiate(config)
    except (TypeError, ValueError) as error:  # a class refusing its arguments, in its own words
        raise CLIConfigError(f"model / data: {type(error).__name__}: {error}") from None
    return RunConfig(
        command=command,
        trainer_class=trainer_class,
        args=args,
        model=instantiated.model,
        data=instantiated.data,
        lightning_overrides=lightning_overrides,
        ckpt_path=config.ckpt_path,
    )


def _build_training_arguments(subparser: Any, config: Any, trainer_class: type) -> Any:
    # lazy: the console script answers --help and `explain` before torch, Lightning or jsonargparse load
    from hf_lightning.trainer.seq2seq import HFLightningSeq2SeqTrainer

    defaults = subparser.get_defaults().args.as_dict()
    given = {key: value for key, value in config.args.as_dict().items() if value != defaults.get(key)}
    seq2seq = issubclass(trainer_class, HFLightningSeq2SeqTrainer)
    if not seq2seq:
        for name in SEQ2SEQ_ONLY_FIELDS:
            if name in given:
                raise CLIConfigError(
                    f"args.{name}={given[name]!r} needs a seq2seq trainer: set "
                    "trainer_class: hf_lightning.HFLightningSeq2SeqTrainer (or remove the field)."
                )
    arguments_class = Seq2SeqTrainingArguments if seq2seq else TrainingArguments
    try:
        return arguments_class(**given)
    except (TypeError, ValueError) as error:
        raise CLIConfigError(f"args: {error}") from None


def _lightning_overrides(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The `trainer:` section: keys checked against the engine's contract, values type-checked and instantiated."""
    import inspect
    from argparse import ArgumentError

    import lightning.pytorch as pl
    from jsonargparse import ArgumentParser

    # lazy: the console script answers --help and `explain` before torch, Lightning or jsonargparse load
    from hf_lightning.engine.lightning_bridge import check_lightning_overrides

    try:
        check_lightning_overrides(raw)
    except ValueError as error:
        raise CLIConfigError(f"trainer: {error}") from None
    if not raw:
        return {}
    parameters = set(inspect.signature(pl.Trainer.__init__).parameters) - {"self"}
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(pl.Trainer, None, skip=parameters - set(raw), instantiate=False)
    try:
        parsed = parser.parse_object(dict(raw), defaults=False)
    except ArgumentError as error:
        raise CLIConfigError(f"trainer: {error}") from None
    instantiated = parser.instantiate(parsed)
    return {key: instantiated[key] for key in raw}


# ---- the commands ------------------------------------------------------------------------------------------------


def run(argv: list[str]) -> CLIRun:
    """Parse `argv` and run the command; raises CLIConfigError for a bad config."""
    command, subparser, config = parse(argv)
    if command != "fit":
        return COMMANDS[command](resolve(command, subparser, config))
    # lazy: the console script answers --help and `explain` before torch, Lightning or jsonargparse load
    from hf_lightning.engine.interrupt_report import set_resume_command

    # An interrupted fit names this command line; only during this run (a later train() in the process is not it).
    set_resume_command(resume_command(argv))
    try:
        return COMMANDS[command](resolve(command, subparser, config))
    finally:
        set_resume_command(None)


def resume_command(argv: list[str]) -> str:
    """`hf-lightning fit ... --ckpt_path {checkpoint}`: this fit's command line, resuming from a checkpoint."""
    import shlex

    kept, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token == "--ckpt_path":
            skip = True
        elif not token.startswith("--ckpt_path="):
            kept.append(token)
    return "hf-lightning " + shlex.join(kept) + " --ckpt_path {checkpoint}"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the four subcommands; returns the process exit code (2 for a bad config)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        # Answered from the field catalogue, before torch, Lightning and jsonargparse load (cli/quick_help.py).
        if "--args.help" in argv[1:]:
            print(args_help(argv[0]), end="")
            return 0
        if any(token in ("-h", "--help") for token in argv[1:]):
            print(quick_help(argv[0], SUBCOMMANDS[argv[0]]), end="")
            return 0
    try:
        run(argv)
    except CLIConfigError as error:
        prog = f"hf-lightning {argv[0]}" if argv and argv[0] in SUBCOMMANDS else "hf-lightning"
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl+C: train() printed where to resume from; no traceback
        return 130
    except SystemExit as exit_:  # --help and --print_config exit after printing
        if exit_.code is None or isinstance(exit_.code, int):
            return exit_.code or 0
        print(exit_.code, file=sys.stderr)  # sys.exit("message"): an error
        return 1
    return 0


def build_trainer(run_config: RunConfig, stage: str) -> tuple[HFLightningTrainer, Any]:
    """The facade for one stage, with the datasets the stage needs and the Lightning overrides set."""
    # lazy: the console script answers --help and `explain` before torch, Lightning or jsonargparse load
    from hf_lightning.cli.data_sources import resolve_data
    from hf_lightning.cli.weights_and_predictions import (
        checkpoint_progress,
        load_checkpoint_weights,
        resolve_checkpoint,
    )

    parts = resolve_data(run_config.data, stage)
    folder = None
    if stage != "fit" and run_config.ckpt_path is not None:
        try:
            folder = resolve_checkpoint(run_config.ckpt_path, run_config.args.output_dir)
            load_checkpoint_weights(run_config.model, folder)
        except ValueError as error:
            raise CLIConfigError(str(error)) from None
        print(f"hf-lightning {stage}: model weights loaded from {folder}", flush=True)
    kwargs: dict[str, Any] = {
        "model": run_config.model,
        "args": run_config.args,
        "data_collator": parts.data_collator,
        "eval_dataset": parts.eval_dataset,
        "processing_class": parts.processing_class,
        "compute_metrics": parts.compute_metrics,
    }
    if stage == "fit":
        if parts.train_dataset is None:
            raise CLIConfigError(f"data: {type(run_config.data).__name__} has no train_dataset to fit on.")
        kwargs["train_dataset"] = parts.train_dataset
    try:
        trainer = run_config.trainer_class(**kwargs)
    except ValueError as error:
        raise CLIConfigError(str(error)) from None
    trainer.lightning_trainer_overrides = run_config.lightning_overrides
    progress = checkpoint_progress(folder) if folder is not None else None
    if progress is not None:
        # Metrics of a loaded checkpoint carry its epoch and step, as Lightning's validate(ckpt_path=...) does.
        trainer.state.epoch, trainer.state.global_step = progress
    return trainer, parts


def fit_command(run_config: RunConfig) -> CLIRun:
    """`train()` (resuming from `ckpt_path`), `save_model()`, train metrics, then `evaluate()` with eval data."""
    ckpt_path = run_config.ckpt_path
    if ckpt_path is not None and ckpt_path != "last" and not os.path.isdir(ckpt_path):
        raise CLIConfigError(
            f"ckpt_path={ckpt_path!r} is not a folder; give a checkpoint-N folder to resume from, or 'last'."
        )
    trainer, parts = build_trainer(run_config, "fit")
    resume = True if ckpt_path == "last" else ckpt_path
    train_output = trainer.train(resume_from_checkpoint=resume)
    trainer.save_model()
    result = CLIRun("fit", trainer, metrics=dict(train_output.metrics))
    _report(trainer, "train", train_output.metrics, result)
    trainer.save_state()
    if parts.eval_dataset is not None:
        metrics = trainer.evaluate()
        result.metrics.update(metrics)
        _report(trainer, "eval", metrics, result)
    plot = _save_plot(trainer)
    if plot is not None:
        result.files.append(plot)
    return result


def validate_command(run_config: RunConfig) -> CLIRun:
    """`evaluate()` on the eval data."""
    trainer, parts = build_trainer(run_config, "validate")
    if parts.eval_dataset is None:
        raise CLIConfigError(f"data: {type(run_config.data).__name__} has no eval_dataset to validate on.")
    metrics = trainer.evaluate()
    result = CLIRun("validate", trainer, metrics=dict(metrics))
    # validate_results.json, outside all_results.json: fit's eval_results.json / all_results.json stay fit's.
    _report(trainer, "eval", metrics, result, file_split="validate", combined=False)
    return result


def test_command(run_config: RunConfig) -> CLIRun:
    """`predict()` on the test data; its `test_*` metrics are reported and saved."""
    trainer, parts = build_trainer(run_config, "test")
    if parts.test_dataset is None:
        raise CLIConfigError(f"data: {type(run_config.data).__name__} has no test_dataset to test on.")
    output = trainer.predict(parts.test_dataset, metric_key_prefix="test")
    result = CLIRun("test", trainer, metrics=dict(output.metrics))
    _report(trainer, "test", output.metrics, result)
    return result


def predict_command(run_config: RunConfig) -> CLIRun:
    """`predict()` on the predict data (else the test data); writes `predictions.npz` (and decoded text)."""
    # lazy: the console script answers --help and `explain` before torch, Lightning or jsonargparse load
    from hf_lightning.cli.weights_and_predictions import write_predictions

    trainer, parts = build_trainer(run_config, "predict")
    dataset = parts.predict_dataset if parts.predict_dataset is not None else parts.test_dataset
    if dataset is None:
        raise CLIConfigError(
            f"data: {type(run_config.data).__name__} has neither predict_dataset nor test_dataset to predict on."
        )
    output = trainer.predict(dataset, metric_key_prefix="predict")
    result = CLIRun("predict", trainer, metrics=dict(output.metrics))
    if trainer.is_world_process_zero():
        generated = bool(getattr(trainer.args, "predict_with_generate", False))
        result.files.extend(
            write_predictions(output, trainer.args.output_dir, parts.processing_class if generated else None)
        )
        for path in result.files:
            print(f"hf-lightning predict: wrote {path}", flush=True)
    if output.metrics:
        _report(trainer, "predict", output.metrics, result)
    return result


COMMANDS = {
    "fit": fit_command,
    "validate": validate_command,
    "test": test_command,
    "predict": predict_command,
}


def _report(
    trainer: HFLightningTrainer,
    split: str,
    metrics: Mapping[str, Any],
    result: CLIRun,
    file_split: str | None = None,
    combined: bool = True,
) -> None:
    """Print the metrics the reference's way and save `{file_split or split}_results.json` (and, when
    `combined`, merge them into `all_results.json`)."""
    file_split = file_split or split
    trainer.log_metrics(split, dict(metrics))
    trainer.save_metrics(file_split, dict(metrics), combined=combined)
    if trainer.is_world_process_zero():
        result.files.append(os.path.join(trainer.args.output_dir, f"{file_split}_results.json"))


def _save_plot(trainer: HFLightningTrainer) -> str | None:
    """Plot `state.log_history` into output_dir; without matplotlib (or the plotting module) warn in one line."""
    if not trainer.is_world_process_zero():
        return None
    try:
        path = save_training_plot(trainer.state.log_history, trainer.args.output_dir)
    except (ImportError, ValueError) as error:  # no matplotlib, or nothing was logged that can be plotted
        print(f"hf-lightning fit: warning: no training plot ({error})", file=sys.stderr, flush=True)
        return None
    print(f"hf-lightning fit: training plot {path}", flush=True)
    return path


if __name__ == "__main__":
    sys.exit(main())
