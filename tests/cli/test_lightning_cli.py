"""`hf-lightning fit | validate | test | predict --config run.yaml` end to end on the embedded data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelSummary
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from hf_lightning.args.training_args import TrainingArguments
from hf_lightning.cli.data_sources import CLI_VOCAB_SIZE, EmbeddedClassificationData
from hf_lightning.cli.embedded import TinyTransformerClassifier
from hf_lightning.cli.lightning_cli import main, parse, run
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.no_transformers import BLOCK_TRANSFORMERS

ROOT = Path(__file__).resolve().parents[2]
MAX_STEPS = 6
DATA_SIZES = {"train_size": 192, "eval_size": 48, "test_size": 40, "seed": 3}


class StepCounter(pl.Callback):
    """A Lightning callback given through `trainer: callbacks:`; counts the training steps Lightning runs."""

    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, *args, **kwargs) -> None:
        self.batches += 1


class EmbeddedDataModule(pl.LightningDataModule):
    """A LightningDataModule over the embedded data: the CLI takes its loader's dataset and collate_fn."""

    def __init__(
        self, train_size: int = 192, eval_size: int = 48, test_size: int = 40, seed: int = 3
    ) -> None:
        super().__init__()
        self.sizes = {"train_size": train_size, "eval_size": eval_size, "test_size": test_size, "seed": seed}

    def setup(self, stage: str) -> None:
        self.data = EmbeddedClassificationData(**self.sizes)

    def val_dataloader(self) -> DataLoader:
        # batch_size 5 is not used: per_device_eval_batch_size applies, as for any dataset the facade loads
        return DataLoader(self.data.eval_dataset, batch_size=5, collate_fn=self.data.data_collator)


def run_config(output_dir: Path, **args) -> dict:
    return {
        "args": {
            "output_dir": str(output_dir),
            "seed": 7,
            "learning_rate": 2e-3,
            "lr_scheduler_type": "constant",
            "max_steps": 100,
            "per_device_train_batch_size": 16,
            "per_device_eval_batch_size": 32,
            "logging_steps": 2,
            "save_strategy": "steps",
            "save_steps": MAX_STEPS,
            "report_to": "none",
            "use_cpu": True,
            "disable_tqdm": True,
            **args,
        },
        "model": {
            "class_path": "hf_lightning.cli.embedded.TinyTransformerClassifier",
            "init_args": {
                "vocab_size": CLI_VOCAB_SIZE,
                "d_model": 32,
                "dim_feedforward": 64,
                "num_layers": 1,
            },
        },
        "data": {
            "class_path": "hf_lightning.cli_data.EmbeddedClassificationData",
            "init_args": dict(DATA_SIZES),
        },
    }


def write_yaml(path: Path, config: dict) -> str:
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory, one_thread):
    """One fit: the config says lr 2e-3 and 100 steps; the command line says lr 5e-4 and MAX_STEPS steps."""
    folder = tmp_path_factory.mktemp("cli_fit")
    config = run_config(folder / "run")
    config["trainer"] = {
        "callbacks": [{"class_path": f"{__name__}.StepCounter"}],
        "enable_model_summary": True,
    }
    path = write_yaml(folder / "run.yaml", config)
    result = run(
        ["fit", "--config", path, "--args.learning_rate", "5e-4", "--args.max_steps", str(MAX_STEPS)]
    )
    return {"config": path, "output_dir": folder / "run", "result": result}


def reference_trainer(
    output_dir: Path, checkpoint: Path
) -> tuple[HFLightningTrainer, EmbeddedClassificationData]:
    """The same model and data, built by hand, with the checkpoint's weights: what the CLI should reproduce."""
    data = EmbeddedClassificationData(**DATA_SIZES)
    model = TinyTransformerClassifier(vocab_size=CLI_VOCAB_SIZE, d_model=32, dim_feedforward=64, num_layers=1)
    model.load_state_dict(load_file(str(checkpoint / "model.safetensors")))
    args = TrainingArguments(
        output_dir=str(output_dir),
        per_device_eval_batch_size=32,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = HFLightningTrainer(
        model=model,
        args=args,
        data_collator=data.data_collator,
        eval_dataset=data.eval_dataset,
        compute_metrics=data.compute_metrics,
    )
    return trainer, data


def same_metrics(cli: dict, reference: dict, prefix: str) -> None:
    for name in (f"{prefix}_loss", f"{prefix}_accuracy"):
        assert cli[name] == pytest.approx(reference[name], rel=1e-6, abs=1e-7), name


def test_fit_trains_saves_and_plots_with_command_line_overrides(fitted):
    result, output_dir = fitted["result"], fitted["output_dir"]
    trainer = result.trainer
    assert trainer.state.global_step == MAX_STEPS  # --args.max_steps beat the config's 100
    learning_rates = [
        entry["learning_rate"] for entry in trainer.state.log_history if "learning_rate" in entry
    ]
    assert learning_rates and all(rate == pytest.approx(5e-4) for rate in learning_rates)  # constant schedule
    assert (output_dir / f"checkpoint-{MAX_STEPS}" / "model.safetensors").is_file()
    assert (output_dir / "model.safetensors").is_file()
    assert json.loads((output_dir / "train_results.json").read_text())["train_loss"] > 0
    assert "eval_accuracy" in json.loads((output_dir / "eval_results.json").read_text())
    assert any(path.endswith(".png") and os.path.isfile(path) for path in result.files)


def test_trainer_section_overrides_show_in_explain_and_take_effect(fitted):
    trainer = fitted["result"].trainer
    counters = [cb for cb in trainer.lightning_trainer.callbacks if isinstance(cb, StepCounter)]
    assert len(counters) == 1 and counters[0].batches == MAX_STEPS  # Lightning ran our callback every step
    summaries = [cb for cb in trainer.lightning_trainer.callbacks if isinstance(cb, ModelSummary)]
    assert summaries  # the translation says enable_model_summary=False; the override won
    explained = trainer.explain()
    section = explained[explained.index("lightning.Trainer overrides (take precedence)") :]
    assert "enable_model_summary = True  (replaces the translated False)" in section
    assert "callbacks = [" in section and "added after the engine's callbacks" in section


def test_validate_test_and_predict_from_the_fitted_checkpoint_match_evaluate(fitted, tmp_path, one_thread):
    config, output_dir = fitted["config"], fitted["output_dir"]
    checkpoint = output_dir / f"checkpoint-{MAX_STEPS}"
    out = str(tmp_path / "after")
    validated = run(
        ["validate", "--config", config, "--args.output_dir", out, "--ckpt_path", str(checkpoint)]
    )
    tested = run(["test", "--config", config, "--args.output_dir", out, "--ckpt_path", str(checkpoint)])
    predicted = run(["predict", "--config", config, "--args.output_dir", out, "--ckpt_path", str(checkpoint)])

    reference, data = reference_trainer(tmp_path / "reference", checkpoint)
    same_metrics(validated.metrics, reference.evaluate(), "eval")
    # fit's final evaluate ran on the same (last-step) weights
    same_metrics(validated.metrics, fitted["result"].metrics, "eval")
    reference_test = reference.predict(data.test_dataset, metric_key_prefix="test")
    same_metrics(tested.metrics, reference_test.metrics, "test")
    assert str(tmp_path / "after" / "predictions.npz") in predicted.files
    saved = np.load(tmp_path / "after" / "predictions.npz")
    np.testing.assert_allclose(saved["predictions"], reference_test.predictions, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(saved["label_ids"], reference_test.label_ids)
    assert json.loads((tmp_path / "after" / "test_results.json").read_text())["test_loss"] == pytest.approx(
        reference_test.metrics["test_loss"]
    )


def test_validate_without_checkpoint_uses_fresh_weights_and_last_finds_the_checkpoint(
    fitted, tmp_path, one_thread
):
    config, output_dir = fitted["config"], str(fitted["output_dir"])
    fresh = run(["validate", "--config", config, "--args.output_dir", str(tmp_path)])
    last = run(["validate", "--config", config, "--args.output_dir", output_dir, "--ckpt_path", "last"])
    same_metrics(last.metrics, fitted["result"].metrics, "eval")
    assert fresh.metrics["eval_loss"] != pytest.approx(last.metrics["eval_loss"])


def test_a_lightning_datamodule_gives_the_same_evaluation_as_the_data_source(tmp_path, one_thread):
    config = write_yaml(tmp_path / "run.yaml", run_config(tmp_path / "run"))
    with_source = run(["validate", "--config", config])
    with_module = run(["validate", "--config", config, "--data", f"{__name__}.EmbeddedDataModule"])
    assert with_module.metrics["eval_loss"] == pytest.approx(with_source.metrics["eval_loss"], rel=1e-6)
    assert "eval_accuracy" not in with_module.metrics  # the module defines no compute_metrics


def test_print_config_round_trips(tmp_path, capsys):
    first = write_yaml(tmp_path / "a.yaml", run_config(tmp_path / "run"))
    argv = ["fit", "--config", first, "--args.learning_rate", "1e-4", "--model.init_args.d_model", "48"]
    assert main([*argv, "--print_config"]) == 0
    printed = capsys.readouterr().out
    assert "learning_rate: 0.0001" in printed and "d_model: 48" in printed
    (tmp_path / "printed.yaml").write_text(printed, encoding="utf-8")
    _, _, original = parse(argv)
    _, _, again = parse(["fit", "--config", str(tmp_path / "printed.yaml")])
    original.pop("config"), again.pop("config")
    assert again == original
    # and printing the printed config gives the same config (0 and 0.0 are the same float field)
    assert main(["fit", "--config", str(tmp_path / "printed.yaml"), "--print_config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == yaml.safe_load(printed)


def test_later_config_files_win_key_by_key(tmp_path):
    first = write_yaml(
        tmp_path / "a.yaml", run_config(tmp_path / "run", num_train_epochs=2, learning_rate=1e-3)
    )
    second = write_yaml(
        tmp_path / "b.yaml", {"args": {"learning_rate": 5e-4}, "data": {"init_args": {"seed": 9}}}
    )
    _, _, config = parse(["fit", "--config", first, "--config", second])
    assert config.args.learning_rate == 5e-4  # the later file wins
    assert config.args.num_train_epochs == 2  # keys it does not set stay
    assert config.data.init_args.seed == 9 and config.data.init_args.train_size == DATA_SIZES["train_size"]


@pytest.mark.parametrize(
    ("section", "extra", "expected"),
    [
        ("args", {"learing_rate": 1e-3}, ["learing_rate"]),
        ("model", {"init_args": {"vocab_sise": 3}}, ["vocab_sise", "TinyTransformerClassifier"]),
        ("trainer", {"max_tiem": "00:00:01:00"}, ["max_tiem", "allowed:", "max_time"]),
    ],
)
def test_unknown_keys_are_named(tmp_path, capsys, section, extra, expected):
    config = run_config(tmp_path / "run")
    config[section] = {**config.get(section, {}), **extra}
    if section == "model":
        config["model"]["init_args"] = {**run_config(tmp_path)["model"]["init_args"], **extra["init_args"]}
    assert main(["fit", "--config", write_yaml(tmp_path / "bad.yaml", config)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("hf-lightning fit: error:")
    for text in expected:
        assert text in error


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--args.eval_strategy", "sometimes"], ["eval_strategy", "'sometimes'", "['no', 'steps', 'epoch']"]),
        (["--args.learning_rate", "fast"], ['"args.learning_rate"', "float", "fast"]),
        (["--trainer", '{"enable_progress_bar": "maybe"}'], ["enable_progress_bar", "maybe", "bool"]),
        (
            ["--args.predict_with_generate", "true"],
            ["args.predict_with_generate", "HFLightningSeq2SeqTrainer"],
        ),
        (["--data", "collections.OrderedDict"], ['"data"', "DataSource", "LightningDataModule"]),
    ],
)
def test_bad_values_name_the_key_and_what_is_allowed(tmp_path, capsys, argv, expected):
    config = write_yaml(tmp_path / "run.yaml", run_config(tmp_path / "run"))
    assert main(["validate", "--config", config, *argv]) == 2
    error = capsys.readouterr().err
    for text in expected:
        assert text in error, error


def test_refused_lightning_overrides_name_the_training_argument(tmp_path, capsys):
    config = run_config(tmp_path / "run")
    config["trainer"] = {"accumulate_grad_batches": 4}
    assert main(["fit", "--config", write_yaml(tmp_path / "run.yaml", config)]) == 2
    error = capsys.readouterr().err
    assert "'accumulate_grad_batches' is refused" in error and "gradient_accumulation_steps" in error

    trainer = HFLightningTrainer(
        model=torch.nn.Linear(2, 2),
        args=TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True),
    )
    assert trainer.lightning_trainer_overrides == {}
    with pytest.raises(ValueError, match=r"'max_steps' is refused.*TrainingArguments\.max_steps"):
        trainer.lightning_trainer_overrides = {"max_steps": 3}
    trainer.lightning_trainer_overrides = {"max_time": "00:00:10:00"}
    assert "max_time = '00:00:10:00'" in trainer.explain()


def shrunk(output_dir: Path) -> list[str]:
    """Command-line overrides that make an example config a seconds-long smoke run."""
    return [
        "--args.output_dir", str(output_dir), "--args.disable_tqdm", "true", "--args.max_steps", "4",
        "--data.init_args.train_size", "64", "--data.init_args.eval_size", "16", "--data.init_args.test_size", "8",
    ]  # fmt: skip


def test_seq2seq_example_fits_then_predicts_generated_text(tmp_path, one_thread):
    small = shrunk(tmp_path / "s2s")
    fitted = run(["fit", "--config", str(ROOT / "examples" / "seq2seq.yaml"), *small])
    assert fitted.trainer.state.global_step == 4 and "eval_topic_accuracy" in fitted.metrics
    predicted = run(
        ["predict", "--config", str(ROOT / "examples" / "seq2seq.yaml"), *small, "--ckpt_path", "last"]
    )
    assert "predict_topic_accuracy" in predicted.metrics
    lines = (tmp_path / "s2s" / "generated_predictions.txt").read_text().splitlines()
    generated = np.load(tmp_path / "s2s" / "predictions.npz")["predictions"]
    assert len(lines) == generated.shape[0] == 8
    tokenizer = predicted.trainer.processing_class
    assert lines[0] == tokenizer.decode([max(int(token), 0) for token in generated[0]])


@pytest.mark.parametrize("example", ["cls.yaml", "clm.yaml"])
def test_examples_build_and_validate(tmp_path, one_thread, example):
    validated = run(["validate", "--config", str(ROOT / "examples" / example), *shrunk(tmp_path)])
    assert validated.metrics["eval_loss"] > 0


def test_console_entry_point_runs_a_config_without_transformers(tmp_path):
    """`hf_lightning.cli.main:main` (the console script's target) reads sys.argv and dispatches `validate`; with
    transformers and accelerate unimportable, a plain-nn.Module config still runs."""
    config = write_yaml(tmp_path / "run.yaml", run_config(tmp_path / "run"))
    script = BLOCK_TRANSFORMERS + textwrap.dedent(
        f"""
        from hf_lightning.cli.main import main
        sys.argv = ["hf-lightning", "validate", "--config", {config!r}]
        code = main()
        assert "transformers" not in sys.modules
        sys.exit(code)
        """
    )
    completed = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "***** eval metrics *****" in completed.stdout
    assert "eval_accuracy" in json.loads((tmp_path / "run" / "validate_results.json").read_text())


def test_fit_without_anything_to_plot_warns_instead_of_failing(tmp_path, capsys):
    """A run that logged nothing plottable (logging off, no evaluation) still ends cleanly, with a warning."""
    from types import SimpleNamespace

    from hf_lightning.cli.lightning_cli import _save_plot

    trainer = SimpleNamespace(
        is_world_process_zero=lambda: True,
        state=SimpleNamespace(log_history=[{"train_runtime": 1.0, "step": 3}]),
        args=SimpleNamespace(output_dir=str(tmp_path)),
    )
    assert _save_plot(trainer) is None
    assert "warning: no training plot" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_the_run_guard_from_a_config(tmp_path, one_thread):
    """`trainer: callbacks:` builds hf_lightning.RunGuard with its init_args; it watches the run (engine/run_guard.py)."""
    config = run_config(tmp_path / "run", max_steps=4, save_strategy="no")
    config["trainer"] = {
        "callbacks": [{"class_path": "hf_lightning.RunGuard", "init_args": {"action": "skip", "window": 3}}]
    }
    result = run(["fit", "--config", write_yaml(tmp_path / "run.yaml", config)])
    (guard,) = [c for c in result.trainer.lightning_trainer_overrides["callbacks"] if type(c).__name__ == "RunGuard"]
    assert (guard.action, guard.detection["window"]) == ("skip", 3)
    assert guard.summary == {"events": [], "skipped_windows": [], "rollbacks": 0}
    assert len(guard._history) == 4  # every update judged
