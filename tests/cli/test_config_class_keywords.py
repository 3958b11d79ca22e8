"""A transformers config in a run config takes every keyword its class takes in Python, in YAML and on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from hf_lightning.cli.data_sources import CLI_VOCAB_SIZE
from hf_lightning.cli.lightning_cli import main, parse, resolve, run
from hf_lightning.cli.open_keywords import route_argv, route_config

TOPICS = {0: "sports", 1: "cooking", 2: "weather", 3: "technology"}


def bert_config(output_dir: Path) -> dict:
    """The usual HF way: a model class whose `config` is a nested class_path with PretrainedConfig keywords."""
    return {
        "args": {
            "output_dir": str(output_dir),
            "max_steps": 2,
            "per_device_train_batch_size": 8,
            "per_device_eval_batch_size": 16,
            "report_to": "none",
            "use_cpu": True,
            "disable_tqdm": True,
        },
        "model": {
            "class_path": "transformers.BertForSequenceClassification",
            "init_args": {
                "config": {
                    "class_path": "transformers.BertConfig",
                    "init_args": {
                        "vocab_size": CLI_VOCAB_SIZE,
                        "hidden_size": 32,
                        "num_hidden_layers": 2,
                        "num_attention_heads": 2,
                        "intermediate_size": 64,
                        "max_position_embeddings": 32,
                        "num_labels": 4,
                        "problem_type": "single_label_classification",
                        "id2label": TOPICS,
                    },
                }
            },
        },
        "data": {
            "class_path": "hf_lightning.cli_data.EmbeddedClassificationData",
            "init_args": {"train_size": 32, "eval_size": 16, "test_size": 16},
        },
    }


def write(tmp_path: Path, config: dict) -> str:
    path = tmp_path / "bert.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return str(path)


@pytest.fixture()
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_pretrained_config_keywords_in_yaml_reach_the_model_and_its_saved_config(tmp_path, one_thread):
    result = run(["fit", "--config", write(tmp_path, bert_config(tmp_path / "out"))])
    config = result.trainer.model.config
    assert (config.num_labels, config.problem_type, config.id2label) == (
        4,
        "single_label_classification",
        TOPICS,
    )
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["problem_type"] == "single_label_classification"
    assert saved["id2label"] == {str(key): value for key, value in TOPICS.items()}
    assert result.trainer.state.global_step == 2


def test_pretrained_config_keywords_on_the_command_line(tmp_path):
    config = bert_config(tmp_path / "out")
    del config["model"]["init_args"]["config"]["init_args"]["id2label"]
    argv = [
        "validate",
        "--config",
        write(tmp_path, config),
        "--model.init_args.config.init_args.num_labels",
        "3",
    ]
    resolved = resolve(*parse(argv))
    assert resolved.model.config.num_labels == 3
    assert resolved.model.classifier.out_features == 3


def test_a_wrong_keyword_value_gives_the_class_own_error(tmp_path, capsys):
    config = bert_config(tmp_path / "out")
    del config["model"]["init_args"]["config"]["init_args"]["id2label"]
    argv = [
        "validate",
        "--config",
        write(tmp_path, config),
        "--model.init_args.config.init_args.num_labels",
        "x",
    ]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("hf-lightning validate: error:"), error
    assert "'str' object cannot be interpreted as an integer" in error


def test_signature_keywords_stay_type_checked_by_the_parser(tmp_path, capsys):
    config = bert_config(tmp_path / "out")
    config["model"]["init_args"]["config"]["init_args"]["problem_type"] = "regresion"
    assert main(["validate", "--config", write(tmp_path, config)]) == 2
    error = capsys.readouterr().err
    assert "problem_type" in error and "regresion" in error


def test_only_keywords_missing_from_the_signature_move_to_dict_kwargs():
    config = {
        "model": {
            "class_path": "pkg.Model",
            "init_args": {
                "config": {"class_path": "pkg.Config", "init_args": {"hidden_size": 8, "num_labels": 2}}
            },
        }
    }
    keywords = {"pkg.Config": {"hidden_size"}}
    assert route_config(config, keywords.get)
    inner = config["model"]["init_args"]["config"]
    assert inner["init_args"] == {"hidden_size": 8} and inner["dict_kwargs"] == {"num_labels": 2}
    argv = [
        "fit",
        "--model",
        "pkg.Model",
        "--model.init_args.config",
        "pkg.Config",
        "--model.init_args.config.init_args.num_labels=2",
        "--model.init_args.config.init_args.hidden_size",
        "8",
    ]
    assert route_argv(argv, keywords.get) == [
        "fit",
        "--model",
        "pkg.Model",
        "--model.init_args.config",
        "pkg.Config",
        "--model.init_args.config.dict_kwargs.num_labels=2",
        "--model.init_args.config.init_args.hidden_size",
        "8",
    ]


def test_the_short_option_form_routes_open_keywords_as_the_long_form_does():
    """jsonargparse's short form (`--model.config.num_labels`) names the same keyword as the `init_args` form."""
    keywords = {"pkg.Config": {"hidden_size"}}
    argv = [
        "fit",
        "--model",
        "pkg.Model",
        "--model.config",
        "pkg.Config",
        "--model.config.num_labels=2",
        "--model.config.hidden_size",
        "8",
    ]
    assert route_argv(argv, keywords.get) == [
        "fit",
        "--model",
        "pkg.Model",
        "--model.config",
        "pkg.Config",
        "--model.init_args.config.dict_kwargs.num_labels=2",
        "--model.config.hidden_size",
        "8",
    ]


def test_pretrained_config_keywords_in_the_short_option_form(tmp_path):
    config = bert_config(tmp_path / "out")
    del config["model"]["init_args"]["config"]["init_args"]["id2label"]
    argv = ["validate", "--config", write(tmp_path, config), "--model.config.num_labels", "3"]
    resolved = resolve(*parse(argv))
    assert resolved.model.config.num_labels == 3
    assert resolved.model.classifier.out_features == 3
