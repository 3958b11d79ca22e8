"""The `hf-lightning` console script.

`hf-lightning` with no arguments (or `hf-lightning train-demo`) is the main job: it trains a tiny
transformer on the embedded task through `HFLightningTrainer`, with nothing downloaded and no
transformers installed, and says where the model went. `hf-lightning explain ARGS.json` shows how
each TrainingArguments field of a JSON file maps onto Lightning. `hf-lightning consolidate CHECKPOINT [OUT]` writes
any checkpoint's model as a Hugging Face model folder. `hf-lightning fit | validate | test | predict
--config run.yaml` runs a configured Trainer the LightningCLI way (hf_lightning/cli/lightning_cli.py).

Heavy imports (torch, lightning) happen inside the commands, so `hf-lightning --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pickle
import sys
import time
from pathlib import Path
from typing import Any

from hf_lightning.args.reference_rules import assumed_accelerator
from hf_lightning.cli.lightning_cli import SUBCOMMANDS  # stdlib-only at import: --help stays instant
from hf_lightning.cli.lightning_cli import main as lightning_cli_main
from hf_lightning.translation.environment import Environment
from hf_lightning.translation.translate import explain, translate

# "module:attribute" of the trainer and arguments classes the main job uses, resolved lazily.
TRAINER_CLASS = "hf_lightning.trainer.trainer:HFLightningTrainer"
TRAINING_ARGUMENTS_CLASS = "hf_lightning.args.training_args:TrainingArguments"

DEFAULT_OUTPUT_DIR = "./hf_lightning_demo"
RESULTS_NAME = "demo_results.json"
COMMANDS = ("train-demo", "explain", "consolidate")
# Subcommands handled by hf_lightning.cli.lightning_cli (jsonargparse), dispatched before argparse sees them.
LIGHTNING_CLI_COMMANDS = ("fit", "validate", "test", "predict")
# Accuracy at or above this multiple of chance is reported as "learned".
LEARNED_FACTOR = 2.0


def _resolve(spec: str) -> Any:
    """Import `module:attribute` (used for the lazily imported trainer and arguments classes)."""
    module_name, _, attribute = spec.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def _positive(kind: type) -> Any:
    """An argparse `type` that parses with `kind` and refuses zero and negative values."""

    def parse(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its "invalid int value" message
    return parse


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: subcommands `train-demo` (the default) and `explain`."""
    parser = argparse.ArgumentParser(
        prog="hf-lightning",
        allow_abbrev=False,  # a prefix (`--epoch`) is a typo to report, not an option to guess
        description=(
            "Run Hugging Face Trainer scripts on PyTorch Lightning's engine. Without a command, "
            "trains a tiny transformer on a built-in task (the same as `hf-lightning train-demo`)."
        ),
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser(
        "train-demo",
        allow_abbrev=False,
        help="train a tiny transformer on the built-in task (default command)",
        description=(
            "Train a tiny transformer on a built-in topic-classification task (generated in-process, "
            "nothing downloaded), evaluate it, and save it as safetensors. Takes well under a minute on a CPU."
        ),
    )
    # The underscore spellings match TrainingArguments and the other commands; the dashed ones keep working.
    demo.add_argument(
        "--output_dir",
        "--output-dir",
        dest="output_dir",
        default=DEFAULT_OUTPUT_DIR,
        help=(
            f"where model.safetensors, config.json, vocab.json and {RESULTS_NAME} go "
            f"(default: {DEFAULT_OUTPUT_DIR})"
        ),
    )
    demo.add_argument("--epochs", type=_positive(float), default=None, help="num_train_epochs (default: 3)")
    demo.add_argument(
        "--seed", type=int, default=42, help="seed of the data, the model and the run (default: 42)"
    )
    demo.add_argument(
        "--max_steps",
        "--max-steps",
        dest="max_steps",
        type=_positive(int),
        default=None,
        help="stop after this many optimizer steps (overrides --epochs)",
    )
    demo.add_argument(
        "--num_threads",
        "--num-threads",
        dest="num_threads",
        type=_positive(int),
        default=1,
        help=(
            "torch CPU threads (default: 1; the model is so small that more threads only add "
            "synchronisation, and on a busy machine make it many times slower)"
        ),
    )

    explain = commands.add_parser(
        "explain",
        allow_abbrev=False,
        help="show how the TrainingArguments in a JSON file map onto Lightning",
        description=(
            "Load a JSON object of TrainingArguments fields and print, field by field, how hf_lightning "
            "carries it out on Lightning. Exit code 1 when some field is refused."
        ),
    )
    explain.add_argument("args_json", metavar="ARGS.json", help="a JSON object of TrainingArguments fields")
    # The machine the run is meant for (default: this one), to preview a GPU run's translation on a laptop.
    explain.add_argument(
        "--accelerator",
        choices=("gpu", "mps", "cpu"),
        default=None,
        help="the target machine's accelerator (default: this machine's); gpu means CUDA, with bf16 and tf32",
    )
    explain.add_argument(
        "--devices", type=_positive(int), default=None, help="processes per node, one per GPU (default: 1)"
    )
    explain.add_argument("--num_nodes", "--num-nodes", dest="num_nodes", type=_positive(int), default=None,
                         help="nodes of the target run (default: 1)")

    consolidate = commands.add_parser(
        "consolidate",
        allow_abbrev=False,
        help="write a checkpoint (any strategy, sharded included) as a Hugging Face model folder",
        description=(
            "Read the whole model of a checkpoint-N folder written by any strategy (one process, DDP, FSDP full "
            "or sharded, tensor parallel) and write model.safetensors with its config into OUT, a folder "
            "from_pretrained loads."
        ),
    )
    consolidate.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint-N folder")
    consolidate.add_argument(
        "out", metavar="OUT", nargs="?", default=None, help="the model folder to write (default: CHECKPOINT-consolidated)"
    )

    for name in LIGHTNING_CLI_COMMANDS:
        # Listed for --help only: main() hands these to hf_lightning.cli.lightning_cli before parsing.
        commands.add_parser(name, help=f"{SUBCOMMANDS[name]} (--config run.yaml)")
    return parser


def _with_default_command(argv: list[str]) -> list[str]:
    """Insert `train-demo` when no command is given (`hf-lightning`, `hf-lightning --epochs 1`)."""
    if not argv:
        return ["train-demo"]
    if argv[0] in COMMANDS or argv[0] in LIGHTNING_CLI_COMMANDS or argv[0] in ("-h", "--help"):
        return argv
    if argv[0].startswith("-"):
        return ["train-demo", *argv]
    return argv  # an unknown command: argparse reports it with the list of commands


def main(argv: list[str] | None = None) -> int:
    """Entry point of `hf-lightning`; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in LIGHTNING_CLI_COMMANDS:

        return lightning_cli_main(argv)
    parser = build_parser()
    options = parser.parse_args(_with_default_command(argv))
    if options.command == "explain":
        target = {"accelerator": options.accelerator, "devices": options.devices, "num_nodes": options.num_nodes}
        return explain_command(Path(options.args_json), parser, target=target)
    if options.command == "consolidate":
        return consolidate_command(options.checkpoint, options.out, parser)
    return train_demo(
        output_dir=options.output_dir,
        seed=options.seed,
        epochs=options.epochs,
        max_steps=options.max_steps,
        num_threads=options.num_threads,
    )


def train_demo(
    output_dir: str = DEFAULT_OUTPUT_DIR,
    seed: int = 42,
    epochs: float | None = None,
    max_steps: int | None = None,
    num_threads: int = 1,
) -> int:
    """The main job: train, evaluate and save the tiny model of the embedded task; prints a summary."""
    if num_threads < 1:
        raise ValueError(f"num_threads={num_threads} must be >= 1 (--num_threads).")
    started = time.perf_counter()
    print("hf-lightning: preparing the built-in task ...", flush=True)
    import torch

    # lazy: the console script answers --help and `explain` before torch, Lightning or jsonargparse load
    from hf_lightning.cli.embedded import CHANCE_ACCURACY, NUM_LABELS, TOPICS, build_embedded_run

    torch.set_num_threads(num_threads)

    overrides: dict[str, Any] = {}
    if epochs is not None:
        overrides["num_train_epochs"] = epochs
    if max_steps is not None:
        overrides["max_steps"] = max_steps
    run = build_embedded_run(output_dir, seed=seed, **overrides)
    model, tokenizer = run["model"], run["tokenizer"]
    num_parameters = sum(parameter.numel() for parameter in model.parameters())
    print(
        f"Task: sort {len(run['train_dataset'])} training sentences into {NUM_LABELS} topics "
        f"({', '.join(TOPICS)}); chance is {CHANCE_ACCURACY:.0%}.\n"
        f"Model: a 2-layer transformer with {num_parameters:,} parameters, vocabulary of "
        f"{tokenizer.vocab_size} words built in-process. Evaluating on {len(run['eval_dataset'])} held-out sentences.",
        flush=True,
    )

    training_arguments_class = _resolve(TRAINING_ARGUMENTS_CLASS)
    trainer_class = _resolve(TRAINER_CLASS)
    trainer = trainer_class(
        model=model,
        args=training_arguments_class(**run["training_args"]),
        data_collator=run["data_collator"],
        train_dataset=run["train_dataset"],
        eval_dataset=run["eval_dataset"],
        processing_class=tokenizer,
        compute_metrics=run["compute_metrics"],
    )
    train_output = trainer.train()
    metrics = trainer.evaluate()
    trainer.save_model(output_dir)
    weights = Path(output_dir) / "model.safetensors"
    if not weights.is_file():
        raise RuntimeError(f"{trainer_class.__name__}.save_model({output_dir!r}) did not write {weights}.")
    model.save_config(output_dir)
    tokenizer.save_pretrained(output_dir)
    results = {
        "train_loss": train_output.training_loss,
        "global_step": train_output.global_step,
        "eval_loss": metrics["eval_loss"],
        "eval_accuracy": metrics["eval_accuracy"],
        "chance_accuracy": CHANCE_ACCURACY,
        "num_parameters": num_parameters,
        "seed": seed,
        "runtime_seconds": round(time.perf_counter() - started, 3),
    }
    # Machine-readable twin of the summary, for scripts and CI smoke tests.
    (Path(output_dir) / RESULTS_NAME).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    _print_summary(results, Path(output_dir))
    _print_examples(model, tokenizer, run["eval_dataset"])
    return 0


def _print_summary(results: dict[str, Any], output_dir: Path) -> None:
    """Print the final summary: losses, accuracy against chance, steps, files and runtime."""
    # lazy: the console script answers --help and `explain` before torch, Lightning or jsonargparse load
    from hf_lightning.cli.embedded import NUM_LABELS

    accuracy, chance = results["eval_accuracy"], results["chance_accuracy"]
    verdict = "learned" if accuracy >= LEARNED_FACTOR * chance else "NOT clearly above chance"
    location = output_dir.resolve()
    files = ", ".join(sorted(path.name for path in location.iterdir() if path.is_file()))
    print(
        f"\n==== hf-lightning demo finished in {results['runtime_seconds']:.1f} s ====\n"
        f"  train loss (mean)  {results['train_loss']:.4f} over {results['global_step']} optimizer steps\n"
        f"  eval loss          {results['eval_loss']:.4f}\n"
        f"  eval accuracy      {accuracy:.1%}  (chance {chance:.0%} with {NUM_LABELS} classes: {verdict})\n"
        f"  model              {location / 'model.safetensors'} ({results['num_parameters']:,} parameters)\n"
        f"  files in {location}: {files}\n"
        f"  reload with        from hf_lightning.cli.embedded import EmbeddedTokenizer, TinyTransformerClassifier\n"
        f"                     TinyTransformerClassifier.from_pretrained({str(location)!r})\n"
        f"                     EmbeddedTokenizer.from_pretrained({str(location)!r})",
        flush=True,
    )


def _print_examples(model: Any, tokenizer: Any, eval_dataset: Any, count: int = 3) -> None:
    """Show a few held-out sentences with the trained model's answer, so the result is concrete."""
    import torch

    # lazy: the console script answers --help and `explain` before torch, Lightning or jsonargparse load
    from hf_lightning.cli.embedded import TOPICS, EmbeddedCollator

    model.eval()
    device = next(model.parameters()).device
    features = [eval_dataset[index] for index in range(count)]
    batch = EmbeddedCollator(tokenizer.pad_token_id)(features)
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device)
        )["logits"]
    print("  examples:")
    for index, predicted in enumerate(logits.argmax(dim=-1).tolist()):
        expected = TOPICS[eval_dataset.labels[index]]
        mark = "ok" if TOPICS[predicted] == expected else f"wrong, expected {expected}"
        print(f"    {eval_dataset.texts[index]!r} -> {TOPICS[predicted]} ({mark})", flush=True)


def explain_command(
    path: Path, parser: argparse.ArgumentParser | None = None, target: dict[str, Any] | None = None
) -> int:
    """`hf-lightning explain ARGS.json`: print how each TrainingArguments field maps onto Lightning (a checkpoint's
    `training_args.bin` works too).

    `target` (`accelerator`, `devices`, `num_nodes`, each None for the default) describes the machine the run is
    meant for; without it, this machine. Returns 0 when every field is honoured (or not applicable), 1 when some
    are refused, 2 on bad input.
    """
    try:
        fields = _read_arguments_file(path)
    except (OSError, ValueError) as error:
        return _fail(parser, f"cannot read {path}: {error}")
    if not isinstance(fields, dict):
        return _fail(
            parser,
            f"{path} must hold a JSON object of TrainingArguments fields, not {type(fields).__name__}.",
        )

    target = {key: value for key, value in (target or {}).items() if value is not None}
    environment = Environment.for_target(**target) if target else None
    training_arguments_class = _resolve(TRAINING_ARGUMENTS_CLASS)
    try:
        # Arguments checked for the target machine (bf16, tf32), not this one, when one is given.
        with assumed_accelerator(_accelerator_kind(environment)):
            arguments = training_arguments_class(**fields)
    except (TypeError, ValueError) as error:
        about_hardware = isinstance(error, ValueError) and any(word in str(error) for word in _HARDWARE_WORDS)
        hint = (
            " (for another machine, give it: --accelerator gpu --devices N --num_nodes N)"
            if about_hardware and not target else ""
        )
        return _fail(parser, f"{path}: invalid TrainingArguments: {error}{hint}")
    # Refusals are shown in the table rather than raised: showing them is what `explain` is for.
    plan = translate(arguments, environment, raise_on_refusal=False)
    if environment is not None:
        print(f"Target machine: {_describe_target(environment)}")
    print(explain(plan), end="")
    refused = [note.field for note in plan.refusals()]
    if refused:
        print(
            f"{len(refused)} field(s) refused ({', '.join(refused)}): a trainer given these arguments raises ValueError.",
            file=sys.stderr,
        )
        return 1
    return 0


# Words of the errors that depend on the machine the arguments are checked on (a GPU-only precision or device).
_HARDWARE_WORDS = ("bf16", "fp16", "tf32", "GPU", "gpu", "CUDA", "cuda", "device", "XPU", "NPU", "MPS")


def _read_arguments_file(path: Path) -> Any:
    """The fields of a JSON file, or of a checkpoint's `training_args.bin` as we write it (a plain dict, read with
    `torch.load(weights_only=True)`; its token placeholders become None). The reference's `training_args.bin`, a
    pickled TrainingArguments object, is refused: unpickling it could run code."""
    raw = path.read_bytes()
    if not raw.startswith(b"PK"):  # not a torch (zip) file
        try:
            return json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as error:
            raise ValueError(f"it is neither JSON nor a training_args.bin ({error.reason} at byte {error.start})") from None
    # lazy: torch loads only for a training_args.bin; `explain ARGS.json` answers without it
    from hf_lightning.core.checkpoint_files import safe_torch_load

    try:
        content = safe_torch_load(str(path))
    except ValueError as error:
        if not isinstance(error.__cause__, pickle.UnpicklingError):  # not a pickle torch can read: a damaged file
            raise ValueError(f"it is not a training_args.bin that can be read ({error})") from None
        # safe_torch_load's own advice (re-create or remove the file) does not fit: the file is the run's record.
        raise ValueError(
            "it holds pickled Python objects, not a training_args.bin of ours; one written by transformers.Trainer "
            "is a pickled TrainingArguments object, which is not unpickled here since that can run code: write its "
            "fields with args.to_json_string() and explain that file"
        ) from None
    if not isinstance(content, dict):
        return content
    # Every *_token field is saved as its placeholder ("<HUB_TOKEN>"): no token is known, as after `to_dict()`.
    return {key: None if value == f"<{key.upper()}>" else value for key, value in content.items()}


def _accelerator_kind(environment: Environment | None) -> str | None:
    if environment is None:
        return None
    return "gpu" if environment.cuda_available else "mps" if environment.mps_available else "cpu"


def _describe_target(environment: Environment) -> str:
    """`8 gpu processes per node x 2 nodes (world size 16)`."""
    kind = _accelerator_kind(environment)
    return (
        f"{environment.local_world_size} {kind} process(es) per node x {environment.num_nodes} node(s) "
        f"(world size {environment.world_size})"
    )


def consolidate_command(checkpoint: str, out: str | None, parser: argparse.ArgumentParser | None = None) -> int:
    """`hf-lightning consolidate CHECKPOINT [OUT]`: the checkpoint's whole model as a Hugging Face folder."""
    # lazy: the console script answers --help and `explain` before torch loads
    from hf_lightning.checkpoint.consolidate import consolidate_checkpoint

    try:
        written = consolidate_checkpoint(checkpoint, out)
    except ValueError as error:
        return _fail(parser, str(error))
    print(f"Wrote the model of {checkpoint} to {written} (load it with from_pretrained).")
    return 0


def _fail(parser: argparse.ArgumentParser | None, message: str) -> int:
    """Report a usage error on stderr and return exit code 2 (argparse's convention)."""
    prog = parser.prog if parser is not None else "hf-lightning"
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
