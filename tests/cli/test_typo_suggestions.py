"""A mistyped option or section of a run config is refused with the closest known name suggested."""

from __future__ import annotations

from pathlib import Path

import yaml

from hf_lightning.cli.data_sources import CLI_VOCAB_SIZE
from hf_lightning.cli.lightning_cli import main


def write_config(tmp_path: Path, **extra) -> str:
    config = {
        "args": {"output_dir": str(tmp_path / "out"), "report_to": "none", "use_cpu": True},
        "model": {
            "class_path": "hf_lightning.cli.embedded.TinyTransformerClassifier",
            "init_args": {
                "vocab_size": CLI_VOCAB_SIZE,
                "d_model": 16,
                "dim_feedforward": 32,
                "num_layers": 1,
            },
        },
        "data": {"class_path": "hf_lightning.cli_data.EmbeddedClassificationData"},
        **extra,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return str(path)


def test_a_mistyped_command_line_option_suggests_the_closest(tmp_path, capsys):
    for option in (["--args.learning_rte", "1e-3"], ["--args.learning_rte=1e-3"]):
        assert main(["validate", "--config", write_config(tmp_path), *option]) == 2
        error = capsys.readouterr().err
        assert "--args.learning_rte" in error and "did you mean '--args.learning_rate'?" in error, error


def test_a_mistyped_top_level_key_is_refused_with_the_closest_section(tmp_path, capsys):
    path = write_config(tmp_path, trainr={"max_time": "00:00:01:00"})
    assert main(["validate", "--config", path]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("hf-lightning validate: error:") and len(error.splitlines()) == 1, error
    assert path in error and "'trainr'" in error and "did you mean 'trainer'?" in error


def test_an_option_prefix_is_not_taken_for_the_option(tmp_path, capsys):
    """argparse's prefix matching took `--args.learning_rat` as `--args.learning_rate`; it is refused now."""
    assert main(["validate", "--config", write_config(tmp_path), "--args.learning_rat", "1e-3"]) == 2
    error = capsys.readouterr().err
    assert "--args.learning_rat" in error and "did you mean '--args.learning_rate'?" in error, error


def _bert_with(tmp_path, **config_keys) -> str:
    from hf_lightning.cli.data_sources import CLI_VOCAB_SIZE

    config = {
        "class_path": "transformers.BertConfig",
        "init_args": {"vocab_size": CLI_VOCAB_SIZE, "hidden_size": 16, "num_attention_heads": 2, **config_keys},
    }
    model = {"class_path": "transformers.BertForSequenceClassification", "init_args": {"config": config}}
    return write_config(tmp_path, model=model)


def test_a_mistyped_model_config_key_warns_with_the_closest_name(tmp_path, capsys):
    from hf_lightning.cli.lightning_cli import parse

    parse(["fit", "--config", _bert_with(tmp_path, num_hiden_layers=2, num_labels=3, problem_type="regression")])
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    # Only the typo: num_labels and problem_type are keywords a config takes (through **kwargs or its signature).
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("hf-lightning fit: warning: BertConfig does not define 'num_hiden_layers'")
    assert "did you mean 'num_hidden_layers'?" in warnings[0]


def test_a_mistyped_model_config_key_on_the_command_line_warns(tmp_path, capsys):
    from hf_lightning.cli.lightning_cli import parse

    option = "--model.init_args.config.init_args.intermediate_sise"
    parse(["fit", "--config", _bert_with(tmp_path), option, "32"])
    error = capsys.readouterr().err
    assert "BertConfig does not define 'intermediate_sise'" in error and "did you mean 'intermediate_size'?" in error
