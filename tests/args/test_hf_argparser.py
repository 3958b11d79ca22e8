"""``hf_lightning.HfArgumentParser`` parses the command lines of transformers' ``HfArgumentParser`` the same way.

Every parity test runs one command line through both parsers: the same user dataclass (``ModelArgs``)
plus each side's ``TrainingArguments``. Model args are compared with ``==``; training args with
``to_dict()`` in full: no key differs (same fields, same normalisation). The end-to-end test runs one
script twice as a subprocess, importing from transformers and from hf_lightning.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import types
import warnings
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Literal, Optional

import pytest

from hf_lightning.args.aliases import V4_ALIASES
from hf_lightning.args.hf_argparser import HfArg, HfArgumentParser
from hf_lightning.args.hf_argparser_v4 import V4_GROUP_TITLE, v4_alias_names
from hf_lightning.args.training_args import Seq2SeqTrainingArguments, TrainingArguments

REPO_ROOT = Path(__file__).resolve().parents[2]


class Color(Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class ModelArgs:
    """A typical script's own arguments: one field per kind of type the parser handles."""

    model_name_or_path: str = field(metadata={"help": "Path or hub id of the pretrained model."})
    hidden_size: int = 32
    dropout: float = 0.1
    freeze_embeddings: bool = False
    use_fast_tokenizer: bool = field(default=True, metadata={"help": "Use a fast tokenizer."})
    max_length: Optional[int] = None
    cache_dir: str | None = None
    trust_remote_code: Optional[bool] = None
    color: Color = Color.RED
    pooling: Literal["mean", "cls", "max"] = "mean"
    layers: list[int] = field(default_factory=lambda: [1, 2])
    tags: list[str] = field(default_factory=list, metadata={"aliases": ["-t"], "help": "Free-form tags."})


@pytest.fixture(scope="module")
def ref() -> types.SimpleNamespace:
    """The reference classes (imported here, after the end-to-end subprocesses have started)."""
    import transformers
    import transformers.hf_argparser  # `HfArg` is not exported at the top level

    return types.SimpleNamespace(
        HfArgumentParser=transformers.HfArgumentParser,
        TrainingArguments=transformers.TrainingArguments,
        Seq2SeqTrainingArguments=transformers.Seq2SeqTrainingArguments,
        HfArg=transformers.hf_argparser.HfArg,
    )


def parse_both(ref: types.SimpleNamespace, argv: list[str], **kwargs) -> tuple[tuple, tuple]:
    """``(ModelArgs, TrainingArguments)`` parsed from ``argv`` by the reference and by us."""
    theirs = ref.HfArgumentParser((ModelArgs, ref.TrainingArguments))
    ours = HfArgumentParser((ModelArgs, TrainingArguments))
    kwargs.setdefault("look_for_args_file", False)
    return (
        theirs.parse_args_into_dataclasses(list(argv), **kwargs),
        ours.parse_args_into_dataclasses(list(argv), **kwargs),
    )


def assert_same(theirs: tuple, ours: tuple) -> None:
    assert len(theirs) == len(ours)
    assert ours[0] == theirs[0]  # ModelArgs: the same class on both sides
    assert type(ours[1]) is TrainingArguments
    assert ours[1].to_dict() == theirs[1].to_dict()
    for t, o in zip(theirs[2:], ours[2:]):
        assert o == t  # extra namespace / remaining strings


# ------------------------------------------------------------------- end to end (started first: slow imports)

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from dataclasses import asdict, dataclass, field
    from enum import Enum
    from typing import Literal, Optional

    from {library} import HfArgumentParser, TrainingArguments

    class Color(Enum):
        RED = "red"
        BLUE = "blue"

    @dataclass
    class ModelArgs:
        model_name_or_path: str = field(metadata={{"help": "Model id."}})
        hidden_size: int = 32
        dropout: float = 0.1
        freeze_embeddings: bool = False
        use_fast_tokenizer: bool = True
        max_length: Optional[int] = None
        color: Color = Color.RED
        pooling: Literal["mean", "cls"] = "mean"
        layers: list[int] = field(default_factory=list)

    parser = HfArgumentParser((ModelArgs, TrainingArguments))
    model_args, training_args = parser.parse_args_into_dataclasses()
    print(json.dumps({{"model": asdict(model_args), "training": training_args.to_dict(),
                      "transformers_imported": "transformers" in sys.modules}}, default=str))
    """
)
SCRIPT_ARGV = [
    "--model-name-or-path", "tiny", "--hidden_size", "64", "--freeze_embeddings", "--no_use_fast_tokenizer",
    "--max_length", "128", "--color", "blue", "--pooling", "cls", "--layers", "3", "4", "5",
    "--output_dir", "OUT", "--learning-rate", "1e-4", "--eval_strategy", "steps", "--eval_steps", "7",
    "--bf16", "false", "--report_to", "none", "--lr_scheduler_type", "cosine", "--seed", "3",
]  # fmt: skip
# Read from `<script>.args` (look_for_args_file defaults to True); the command line above overrides `seed`.
ARGS_FILE = "--seed 99 --logging_steps 5 --dataloader_drop_last"


@pytest.fixture(scope="module", autouse=True)
def e2e_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.Popen]:
    """Start both script runs before anything imports transformers here, so the imports overlap."""
    folder = tmp_path_factory.mktemp("e2e")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    runs = {}
    for library in ("transformers", "hf_lightning"):
        script = folder / f"train_{library}.py"
        script.write_text(SCRIPT.format(library=library))
        script.with_suffix(".args").write_text(ARGS_FILE)
        argv = [a.replace("OUT", str(folder / "out")) for a in SCRIPT_ARGV]
        runs[library] = subprocess.Popen(
            [sys.executable, str(script), *argv],
            cwd=folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    yield runs
    for run in runs.values():
        if run.poll() is None:
            run.kill()


def test_script_command_line_parses_the_same_with_either_import(e2e_runs) -> None:
    outputs = {}
    for library, run in e2e_runs.items():
        stdout, stderr = run.communicate(timeout=120)
        assert run.returncode == 0, f"{library} run failed:\n{stderr}"
        outputs[library] = json.loads(stdout.strip().splitlines()[-1])
    theirs, ours = outputs["transformers"], outputs["hf_lightning"]
    assert ours["transformers_imported"] is False  # transformers stays optional
    assert ours["model"] == theirs["model"]
    assert ours["training"] == theirs["training"]
    # The values came from the command line and the .args file, not from defaults.
    assert ours["model"]["layers"] == [3, 4, 5] and ours["model"]["use_fast_tokenizer"] is False
    assert ours["training"]["seed"] == 3 and ours["training"]["logging_steps"] == 5
    assert ours["training"]["dataloader_drop_last"] is True


# ------------------------------------------------------------------- the arguments themselves


@pytest.mark.parametrize("seq2seq", [False, True])
def test_training_arguments_give_the_same_argparse_actions(ref, seq2seq: bool) -> None:
    """Every reference option exists here with the same destination, shape, default, choices and help."""
    theirs = ref.HfArgumentParser(ref.Seq2SeqTrainingArguments if seq2seq else ref.TrainingArguments)
    ours = HfArgumentParser(Seq2SeqTrainingArguments if seq2seq else TrainingArguments)
    their_actions = {tuple(a.option_strings): a for a in theirs._actions}
    our_actions = {tuple(a.option_strings): a for a in ours._actions}
    # Ours has the v4 flags on top (checked in the v4 tests); everything else is the reference's, in order.
    v4_options = {opts for opts, a in our_actions.items() if a.dest in v4_alias_names()}
    assert [o for o in our_actions if o not in v4_options] == list(their_actions)
    for options, t in their_actions.items():
        o = our_actions[options]
        for attr in ("dest", "nargs", "const", "default", "required", "help", "metavar"):
            assert getattr(o, attr) == getattr(t, attr), (options, attr)
        assert (list(o.choices) if o.choices else None) == (list(t.choices) if t.choices else None), options
        # `parallelism_config` is typed with accelerate's ParallelismConfig in the reference and `Any` here
        # (accelerate is optional); neither turns a command-line string into a usable config.
        if o.dest != "parallelism_config":
            assert getattr(o.type, "__name__", None) == getattr(t.type, "__name__", None), options


@pytest.mark.parametrize(
    "argv",
    [
        ["--model_name_or_path", "m"],
        ["--model_name_or_path", "m", "--freeze_embeddings", "--no_use_fast_tokenizer", "--use_cpu", "--bf16", "yes"],
        ["--model_name_or_path", "m", "--freeze_embeddings", "false", "--use_fast_tokenizer", "0", "--fp16", "t"],
        ["--model_name_or_path", "m", "--no-use-fast-tokenizer", "--no-dataloader-pin-memory"],
        ["--model_name_or_path", "m", "--trust_remote_code", "y", "--tf32", "false"],
        ["--model-name-or-path", "m", "--hidden-size", "8", "--learning-rate", "2e-5", "--warmup_steps", "0.25"],
        ["--model_name_or_path", "m", "--color", "blue", "--pooling", "max", "--eval_strategy", "epoch",
         "--save_strategy", "best", "--metric_for_best_model", "accuracy", "--lr_scheduler_type", "cosine",
         "--optim", "adamw_torch", "--log_level", "info"],
        ["--model_name_or_path", "m", "--layers", "7", "8", "9", "-t", "a", "b", "--include_for_metrics", "inputs",
         "loss", "--label_names", "labels", "--debug", "underflow_overflow", "--report_to", "none"],
        ["--model_name_or_path", "m", "--activation_checkpointing", "--fsdp", "--lr_scheduler_kwargs",
         '{"num_cycles": "2"}', "--max_steps", "10", "--logging_steps", "0.5"],
        ["--model_name_or_path", "m", "--gradient_checkpointing", "--include_num_input_tokens_seen", "true",
         "--dataloader_multiprocessing_context", "spawn", "--eval_steps", "3"],
    ],
    ids=["defaults", "bool-flags", "bool-values", "no-dashes", "optional-bool", "dashes", "choices", "lists",
         "nargs-const-json", "deprecated-v5-alias"],
)  # fmt: skip
def test_command_lines_parse_to_equal_dataclasses(ref, argv: list[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # `--gradient_checkpointing` warns on both sides
        theirs, ours = parse_both(ref, argv)
    assert_same(theirs, ours)


def test_parsed_values_have_the_reference_types(ref) -> None:
    argv = [
        "--model_name_or_path",
        "m",
        "--color",
        "blue",
        "--pooling",
        "cls",
        "--layers",
        "5",
        "--no_use_fast_tokenizer",
    ]
    theirs, ours = parse_both(ref, argv)
    assert_same(theirs, ours)
    model = ours[0]
    # An Enum field parses to the member's value (the reference's rule), the untouched default stays a member.
    assert model.color == "blue" and model.layers == [5] and model.use_fast_tokenizer is False
    assert (
        HfArgumentParser(ModelArgs).parse_args_into_dataclasses(["--model_name_or_path", "m"])[0].color
        is Color.RED
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--model_name_or_path", "m", "--freeze_embeddings", "maybe"],
        ["--model_name_or_path", "m", "--color", "green"],
        ["--model_name_or_path", "m", "--pooling", "sum"],
        ["--model_name_or_path", "m", "--hidden_size", "big"],
        ["--model_name_or_path", "m", "--log_level", "loud"],
        ["--model_name_or_path", "m", "--layers"],
        ["--hidden_size", "8"],  # required field missing
        # `str | bool` is parsed as a bool by the reference's union rule, so its "all" is refused there too.
        ["--model_name_or_path", "m", "--include_num_input_tokens_seen", "all"],
    ],
    ids=[
        "bad-bool",
        "bad-enum",
        "bad-literal",
        "bad-int",
        "bad-choice",
        "empty-list",
        "required-missing",
        "str-or-bool-quirk",
    ],
)
def test_bad_command_lines_fail_as_in_the_reference(ref, argv: list[str], capsys) -> None:
    errors = []
    for parser in (
        ref.HfArgumentParser((ModelArgs, ref.TrainingArguments), prog="train.py"),
        HfArgumentParser((ModelArgs, TrainingArguments), prog="train.py"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args_into_dataclasses(argv, look_for_args_file=False)
        assert exit_info.value.code == 2
        errors.append(capsys.readouterr().err.splitlines()[-1])
    assert errors[1] == errors[0]
    if argv == ["--hidden_size", "8"]:
        assert "required: --model_name_or_path/--model-name-or-path" in errors[1]


def test_remaining_strings_and_extra_namespace(ref) -> None:
    argv = ["--model_name_or_path", "m", "--extra", "5", "--unknown", "x"]
    parsers = []
    for parser_cls, training_cls in (
        (ref.HfArgumentParser, ref.TrainingArguments),
        (HfArgumentParser, TrainingArguments),
    ):
        parser = parser_cls((ModelArgs, training_cls))
        parser.add_argument("--extra", type=int, default=0)
        parsers.append(parser)
    results = [
        p.parse_args_into_dataclasses(argv, return_remaining_strings=True, look_for_args_file=False)
        for p in parsers
    ]
    assert_same(*results)
    assert results[1][2] == argparse.Namespace(extra=5) and results[1][3] == ["--unknown", "x"]
    messages = []
    for parser in parsers:
        with pytest.raises(ValueError, match="not used by the HfArgumentParser") as err:
            parser.parse_args_into_dataclasses(argv, look_for_args_file=False)
        messages.append(str(err.value))
    assert messages[1] == messages[0]


def test_args_files(ref, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "train.args").write_text("--model_name_or_path from_default --hidden_size 1 --seed 1")
    (tmp_path / "a.args").write_text("--hidden_size 2 --seed 2 --dropout 0.5")
    (tmp_path / "b.args").write_text("--seed 3")
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "train.py"), "--dropout", "0.25"])

    def both(**kwargs) -> tuple[tuple, tuple]:
        return (
            ref.HfArgumentParser((ModelArgs, ref.TrainingArguments)).parse_args_into_dataclasses(**kwargs),
            HfArgumentParser((ModelArgs, TrainingArguments)).parse_args_into_dataclasses(**kwargs),
        )

    # `<script>.args` next to sys.argv[0]; the command line (sys.argv[1:]) wins.
    theirs, ours = both()
    assert_same(theirs, ours)
    assert (ours[0].model_name_or_path, ours[0].hidden_size, ours[0].dropout, ours[1].seed) == (
        "from_default",
        1,
        0.25,
        1,
    )
    # Files named by a flag come after the default file; the last one wins.
    argv = ["--args_file", str(tmp_path / "a.args"), "--args_file", str(tmp_path / "b.args")]
    theirs, ours = both(args=argv, args_file_flag="--args_file")
    assert_same(theirs, ours)
    assert (ours[0].hidden_size, ours[0].dropout, ours[1].seed) == (2, 0.5, 3)
    # `args_filename` replaces the default file; `look_for_args_file=False` reads none.
    theirs, ours = both(args=["--model_name_or_path", "m"], args_filename=str(tmp_path / "a.args"))
    assert_same(theirs, ours)
    assert (ours[0].model_name_or_path, ours[0].hidden_size) == ("m", 2)
    theirs, ours = both(args=["--model_name_or_path", "m"], look_for_args_file=False)
    assert_same(theirs, ours)
    assert ours[0].hidden_size == 32


def test_parse_dict_json_and_yaml(ref, tmp_path: Path) -> None:
    values = {
        "model_name_or_path": "m",
        "layers": [4],
        "output_dir": str(tmp_path),
        "eval_strategy": "steps",
        "eval_steps": 3,
    }
    (tmp_path / "a.json").write_text(json.dumps(values))
    (tmp_path / "a.yaml").write_text("\n".join(f"{k}: {json.dumps(v)}" for k, v in values.items()))
    theirs = ref.HfArgumentParser((ModelArgs, ref.TrainingArguments))
    ours = HfArgumentParser((ModelArgs, TrainingArguments))
    assert_same(theirs.parse_dict(values), ours.parse_dict(values))
    assert_same(theirs.parse_json_file(tmp_path / "a.json"), ours.parse_json_file(tmp_path / "a.json"))
    assert_same(
        theirs.parse_yaml_file(str(tmp_path / "a.yaml")), ours.parse_yaml_file(str(tmp_path / "a.yaml"))
    )
    assert ours.parse_yaml_file(tmp_path / "a.yaml")[1].eval_steps == 3

    extra = {**values, "not_a_field": 1}
    messages = []
    for parser in (theirs, ours):
        with pytest.raises(ValueError, match="not_a_field") as err:
            parser.parse_dict(extra)
        messages.append(str(err.value))
    assert messages[1] == messages[0]
    assert_same(
        theirs.parse_dict(extra, allow_extra_keys=True), ours.parse_dict(extra, allow_extra_keys=True)
    )


def test_help_text_matches_the_reference(ref, capsys) -> None:
    @dataclass
    class Grouped:
        _argument_group_name = "My group"
        level: int = field(default=1, metadata={"help": "The level."})

    helps = []
    for parser_cls in (ref.HfArgumentParser, HfArgumentParser):
        parser = parser_cls((ModelArgs, Grouped), prog="train.py")
        with pytest.raises(SystemExit):
            parser.parse_args_into_dataclasses(["--help"], look_for_args_file=False)
        helps.append(capsys.readouterr().out)
    assert helps[1] == helps[0]
    assert "Path or hub id of the pretrained model." in helps[1] and "My group:" in helps[1]
    assert "Use a fast tokenizer. (default: True)" in helps[1]

    help_text = HfArgumentParser(TrainingArguments, prog="train.py").format_help()
    assert "The initial learning rate for the optimizer. (default: 5e-05)" in " ".join(help_text.split())
    assert V4_GROUP_TITLE in help_text


def test_hf_arg_builds_the_reference_field(ref) -> None:
    kwargs = {"aliases": ["--example", "-e"], "help": "What a nice syntax!", "default": "x"}
    ours, theirs = HfArg(**kwargs), ref.HfArg(**kwargs)
    assert (ours.default, dict(ours.metadata)) == (theirs.default, dict(theirs.metadata))
    required_list = HfArg(default_factory=list, help="h")
    assert required_list.default_factory is list and required_list.metadata["help"] == "h"

    @dataclass
    class WithHfArg:
        name: str = HfArg(aliases="-n", help="Name.")

    (parsed,) = HfArgumentParser(WithHfArg).parse_args_into_dataclasses(["-n", "z"], look_for_args_file=False)
    assert parsed.name == "z"


def test_unsupported_annotations_fail_as_in_the_reference(ref) -> None:
    @dataclass
    class TwoTypes:
        value: int | float = 1

    @dataclass
    class Unresolvable:
        value: NotDefinedAnywhere = None  # noqa: F821

    for dtype, error in ((TwoTypes, ValueError), (Unresolvable, RuntimeError)):
        messages = []
        for parser_cls in (ref.HfArgumentParser, HfArgumentParser):
            with pytest.raises(error) as err:
                parser_cls(dtype)
            messages.append(str(err.value))
        assert messages[1] == messages[0]


def test_parser_leaves_the_dataclass_fields_untouched() -> None:
    """The reference rewrites ``Field.type`` of the user's class (``Optional[int]`` -> ``int``); we do not."""

    @dataclass
    class Fresh:
        max_length: Optional[int] = None

    HfArgumentParser(Fresh)
    assert dataclasses.fields(Fresh)[0].type == "Optional[int]"


# ------------------------------------------------------------------- v4 flag names (ours only)


def test_v4_flags_cover_every_v4_alias() -> None:
    assert v4_alias_names() == set(V4_ALIASES)


def test_v4_flags_reach_the_constructor_which_folds_them(ref) -> None:
    argv = ["--model_name_or_path", "m", "--evaluation_strategy", "steps", "--eval_steps", "5", "--no_cuda",
            "--warmup_ratio", "0.1", "--per-gpu-train-batch-size", "4", "--group_by_length"]  # fmt: skip
    with pytest.warns(FutureWarning) as record:
        _, training = HfArgumentParser((ModelArgs, TrainingArguments)).parse_args_into_dataclasses(
            argv, look_for_args_file=False
        )
    warned = {name for name in V4_ALIASES for w in record if str(w.message).startswith(f"`{name}`")}
    assert warned == {
        "evaluation_strategy",
        "no_cuda",
        "warmup_ratio",
        "per_gpu_train_batch_size",
        "group_by_length",
    }
    expected = TrainingArguments(
        eval_strategy="steps", eval_steps=5, use_cpu=True, warmup_steps=0.1, per_device_train_batch_size=4,
        train_sampling_strategy="group_by_length",
    )  # fmt: skip
    assert training.to_dict() == expected.to_dict()
    # transformers 5.24 dropped these names: its parser leaves them unused.
    with pytest.raises(ValueError, match="--evaluation_strategy"):
        ref.HfArgumentParser((ModelArgs, ref.TrainingArguments)).parse_args_into_dataclasses(
            argv, look_for_args_file=False
        )
    # parse_dict takes them too (a v4 JSON config), as the constructor does.
    with pytest.warns(FutureWarning, match="no_cuda"):
        (from_dict,) = HfArgumentParser(TrainingArguments).parse_dict({"no_cuda": True})
    assert from_dict.use_cpu is True


def test_v4_flags_absent_do_not_warn_and_refused_values_raise() -> None:
    parser = HfArgumentParser(Seq2SeqTrainingArguments)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (plain,) = parser.parse_args_into_dataclasses(["--predict_with_generate"], look_for_args_file=False)
    assert plain.predict_with_generate is True
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="always safetensors"):
        parser.parse_args_into_dataclasses(["--no_save_safetensors"], look_for_args_file=False)
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="FairScale"):
        parser.parse_args_into_dataclasses(
            ["--sharded_ddp", "zero_dp_2", "offload"], look_for_args_file=False
        )
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="conflicts"):
        parser.parse_args_into_dataclasses(
            ["--evaluation_strategy", "epoch", "--eval_strategy", "steps"], look_for_args_file=False
        )
    # A user dataclass that is not ours gets no v4 flags.
    assert all(a.dest not in V4_ALIASES for a in HfArgumentParser(ModelArgs)._actions)


def test_v4_flags_only_where_the_constructor_folds_them() -> None:
    """A plain ``@dataclass`` subclass has a generated ``__init__`` that rejects v4 keywords: no v4 flags."""

    @dataclass
    class MyArgs(TrainingArguments):
        extra: int = 1

    class Renamed(TrainingArguments):  # not a new dataclass: keeps our folding __init__
        pass

    plain = HfArgumentParser(MyArgs)
    assert all(a.dest not in V4_ALIASES for a in plain._actions)
    (parsed,) = plain.parse_args_into_dataclasses(["--extra", "2", "--seed", "5"], look_for_args_file=False)
    assert (parsed.extra, parsed.seed) == (2, 5)
    with pytest.warns(FutureWarning):
        (renamed,) = HfArgumentParser(Renamed).parse_args_into_dataclasses(
            ["--no_cuda"], look_for_args_file=False
        )
    assert renamed.use_cpu is True


def test_a_subclass_overriding_the_field_hook_is_used():
    """`_parse_dataclass_field` is the reference's per-field hook: a subclass that overrides it sees every field."""
    from dataclasses import dataclass

    from hf_lightning.args.hf_argparser import HfArgumentParser as Ours

    seen = []

    class Recording(Ours):
        @staticmethod
        def _parse_dataclass_field(parser, field):
            seen.append((field.name, field.type))
            Ours._parse_dataclass_field(parser, field)

    @dataclass
    class Options:
        depth: int = 2
        name: str = "x"

    (options,) = Recording(Options).parse_args_into_dataclasses(["--depth", "3"])
    assert seen == [("depth", int), ("name", str)] and options.depth == 3
