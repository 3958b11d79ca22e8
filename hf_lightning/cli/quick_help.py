"""`hf-lightning fit | validate | test | predict --help` and `--args.help`, answered without torch or Lightning.

jsonargparse's own help needs the classes the options take (torch's `nn.Module`, Lightning's `LightningDataModule`),
so it costs their import (about ten seconds on a busy 2-core machine) and lists ~130 options in ~580 lines. `--help`
here is one screen: each section of a run config, what it takes and where its details are; `--args.help` describes
every TrainingArguments field, one entry each, from the field catalogue (stdlib only).
"""

from __future__ import annotations

import dataclasses
import textwrap

from hf_lightning.args.training_args import Seq2SeqTrainingArguments

# The data sources `hf_lightning.cli_data` provides (tests/cli/test_help.py keeps this list equal to the module's).
BUILT_IN_DATA = ("EmbeddedClassificationData", "EmbeddedCausalLMData", "EmbeddedSeq2SeqData")
WIDTH = 110
_COLUMN = 24


def _option(name: str, text: str) -> str:
    """`  --name      text`, the text wrapped under its column."""
    head = f"  {name}"
    body = textwrap.wrap(text, WIDTH - _COLUMN)
    if len(head) >= _COLUMN - 1:
        return "\n".join([head] + [" " * _COLUMN + line for line in body])
    return "\n".join([head.ljust(_COLUMN) + body[0]] + [" " * _COLUMN + line for line in body[1:]])


def quick_help(command: str, description: str) -> str:
    """The help of `hf-lightning COMMAND`: usage, the config's sections and where each one's details are."""
    ckpt = (
        "resume from this checkpoint folder ('last': the newest complete one in output_dir)"
        if command == "fit"
        else "load the model weights of this checkpoint-N folder (or 'last' / 'best' of output_dir)"
    )
    count = len([field for field in dataclasses.fields(Seq2SeqTrainingArguments) if field.init])
    options = [
        ("-h, --help", "show this help and exit"),
        ("-c, --config CONFIG", "a YAML / JSON run config; repeat it to layer files (later wins)"),
        ("--print_config", "print the whole resolved config (every default) and exit; it is a reusable --config"),
        ("--args.FIELD VALUE", f"a TrainingArguments field (YAML section `args:`); `hf-lightning {command} --args.help` "
         f"describes all {count}"),
        ("--model CLASS_PATH", "an nn.Module class, or a function returning one, with its keywords under `init_args` "
         "(a transformers model takes its config as a nested class_path); "
         f"`hf-lightning {command} --model.help CLASS` lists a class's arguments"),
        ("--data CLASS_PATH", "a LightningDataModule, or a class declaring train_dataset, eval_dataset, test_dataset "
         "and data_collator (hf_lightning.cli_data.DataSource); built in: "
         + ", ".join(f"hf_lightning.cli_data.{name}" for name in BUILT_IN_DATA)
         + f"; `hf-lightning {command} --data.help CLASS` lists a class's arguments; a module in the working "
         "folder is found (class_path: mydata.MyData)"),
        ("--trainer.KEY VALUE", "native lightning.Trainer arguments that take precedence (callbacks, logger, "
         "profiler, max_time, plugins, ...); keys the engine owns are refused, naming the field to use"),
        ("--trainer_class CLASS", "the trainer class (default hf_lightning.HFLightningTrainer; "
         "hf_lightning.HFLightningSeq2SeqTrainer makes args Seq2SeqTrainingArguments)"),
        ("--ckpt_path PATH", ckpt),
    ]  # fmt: skip
    lines = [
        f"usage: hf-lightning {command} [-h] [-c CONFIG] [--print_config] [--args.FIELD VALUE ...] "
        "--model CLASS_PATH --data CLASS_PATH [--trainer.KEY VALUE ...] [--trainer_class CLASS_PATH] "
        "[--ckpt_path PATH]",
        "",
        description,
        "",
        "Every option is a key of the run config (`args: {learning_rate: 1e-4}` or `--args.learning_rate 1e-4`):",
        *(_option(name, text) for name, text in options),
        "",
        "Examples (the configs of the checkout's examples/ folder run offline):",
        "  OMP_NUM_THREADS=1 hf-lightning fit --config examples/cls.yaml --args.learning_rate 5e-4",
        "  OMP_NUM_THREADS=1 hf-lightning fit --config examples/clm.yaml --print_config > run.yaml",
    ]
    return "\n".join(lines) + "\n"


def args_help(command: str) -> str:
    """Every `--args.FIELD` of `hf-lightning COMMAND`: type, default and the reference's help text."""
    lines = [f"hf-lightning {command}: the `args` section, TrainingArguments fields (Seq2Seq ones last):", ""]
    for field in dataclasses.fields(Seq2SeqTrainingArguments):
        if not field.init:
            continue
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = None
        help_text = " ".join(str(field.metadata.get("help", "")).split())
        lines.append(f"  --args.{field.name} (default: {default!r})")
        lines.extend(" " * 6 + line for line in textwrap.wrap(help_text, WIDTH - 6))
    return "\n".join(lines) + "\n"
