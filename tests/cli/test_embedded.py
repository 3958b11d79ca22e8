"""The embedded task of the main job (data, tokenizer, collator, tiny model, learnability) and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import hf_lightning.cli.main as cli
from hf_lightning.cli.embedded import (
    CHANCE_ACCURACY,
    FILLER_WORDS,
    NUM_LABELS,
    TOPIC_WORDS,
    TOPICS,
    EmbeddedCollator,
    EmbeddedTokenizer,
    TinyTransformerClassifier,
    accuracy_metric,
    build_embedded_run,
    generate_examples,
)
from tests.no_transformers import BLOCK_TRANSFORMERS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread (and the CLI sets one); restore the process's setting after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def test_generated_examples_are_deterministic_per_seed_and_split():
    assert generate_examples(50, 7, "train") == generate_examples(50, 7, "train")
    assert generate_examples(50, 7, "train") != generate_examples(50, 8, "train")
    assert generate_examples(50, 7, "train") != generate_examples(50, 7, "eval")
    # Each split has its own stream: a longer train split starts with the shorter one.
    assert generate_examples(80, 7, "train")[:50] == generate_examples(50, 7, "train")
    # Pinned first example: a change of the generator (and so of every reported number) is visible.
    assert generate_examples(1, 42, "train")[0] == {
        "text": "new of drizzle screen this database new app battery rain fog of",
        "label": TOPICS.index("technology"),
    }


def test_each_label_is_the_topic_with_most_words_and_labels_are_balanced():
    examples = generate_examples(2000, 3, "train")
    vocabulary = set(FILLER_WORDS).union(*TOPIC_WORDS.values())
    for example in examples:
        words = example["text"].split()
        assert set(words) <= vocabulary
        counts = [sum(word in TOPIC_WORDS[topic] for word in words) for topic in TOPICS]
        assert counts[example["label"]] == max(counts)
        assert counts.count(max(counts)) == 1  # never a tie
    shares = np.bincount([example["label"] for example in examples], minlength=NUM_LABELS) / len(examples)
    assert np.all(np.abs(shares - CHANCE_ACCURACY) < 0.05)


# ---------------------------------------------------------------------------------------------
# Tokenizer and collator
# ---------------------------------------------------------------------------------------------


def test_tokenizer_round_trip_and_special_tokens():
    texts = [example["text"] for example in generate_examples(200, 0, "train")]
    tokenizer = EmbeddedTokenizer.train(texts)
    assert [tokenizer.vocab[token] for token in ("[PAD]", "[UNK]", "[CLS]")] == [0, 1, 2]
    assert (
        tokenizer.vocab_size == len(tokenizer) == 3 + len({word for text in texts for word in text.split()})
    )
    for text in texts[:20]:
        encoded = tokenizer(text)
        assert encoded["input_ids"][0] == tokenizer.cls_token_id
        assert encoded["attention_mask"] == [1] * len(encoded["input_ids"])
        assert tokenizer.decode(encoded["input_ids"]) == text
    assert tokenizer("Football ZEBRA")["input_ids"] == [
        2,
        tokenizer.vocab["football"],
        tokenizer.unk_token_id,
    ]
    assert tokenizer.decode([2, tokenizer.vocab["football"], 1, 0], skip_special_tokens=False) == (
        "[CLS] football [UNK] [PAD]"
    )
    batch = tokenizer(texts[:3])
    assert batch["input_ids"] == [tokenizer.encode(text)["input_ids"] for text in texts[:3]]
    assert len(tokenizer(" ".join(["rain"] * 100))["input_ids"]) == tokenizer.model_max_length


def test_tokenizer_vocabulary_is_deterministic_and_reloads(tmp_path):
    texts = [example["text"] for example in generate_examples(300, 5, "train")]
    tokenizer = EmbeddedTokenizer.train(texts)
    assert EmbeddedTokenizer.train(texts).vocab == tokenizer.vocab
    assert EmbeddedTokenizer.train(list(reversed(texts))).vocab == tokenizer.vocab  # order-independent
    written = tokenizer.save_pretrained(tmp_path)
    assert written == [str(tmp_path / "vocab.json")]
    assert EmbeddedTokenizer.from_pretrained(tmp_path).vocab == tokenizer.vocab
    with pytest.raises(ValueError, match=r"vocab\['\[PAD\]'\] must be 0"):
        EmbeddedTokenizer({"a": 0, "[UNK]": 1, "[CLS]": 2})


def test_collator_pads_to_longest_and_masks():
    features = [
        {"input_ids": [2, 5, 6], "labels": 1},
        {"input_ids": [2, 7], "labels": 3},
        {"input_ids": [2], "labels": 0},
    ]
    batch = EmbeddedCollator(pad_token_id=0)(features)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["input_ids"].tolist() == [[2, 5, 6], [2, 7, 0], [2, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0], [1, 0, 0]]
    assert batch["labels"].tolist() == [1, 3, 0]
    assert batch["input_ids"].dtype == batch["labels"].dtype == torch.long


def test_tokenizer_pad_serves_the_reference_data_collator_with_padding():
    from transformers import DataCollatorWithPadding

    run = build_embedded_run("unused", seed=1, train_size=64, eval_size=8)
    features = [run["train_dataset"][index] for index in range(5)]
    ours = run["data_collator"](features)
    reference = DataCollatorWithPadding(tokenizer=run["tokenizer"])(features)
    assert set(reference) == set(ours)
    for key in ours:
        assert torch.equal(reference[key], ours[key]), key
    multiple = DataCollatorWithPadding(tokenizer=run["tokenizer"], pad_to_multiple_of=8)(features)
    assert multiple["input_ids"].shape[1] % 8 == 0
    assert torch.equal(multiple["input_ids"][:, : ours["input_ids"].shape[1]], ours["input_ids"])
    with pytest.raises(ValueError, match="padding='do_not_pad' is not supported"):
        run["tokenizer"].pad(features, padding="do_not_pad")


# ---------------------------------------------------------------------------------------------
# Model and metric
# ---------------------------------------------------------------------------------------------


def test_model_returns_loss_and_logits_with_right_shapes():
    torch.manual_seed(0)
    model = TinyTransformerClassifier(vocab_size=50)
    input_ids = torch.randint(3, 50, (4, 9))
    labels = torch.tensor([0, 1, 2, 3])
    outputs = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=labels)
    assert list(outputs) == ["loss", "logits"]
    assert outputs["logits"].shape == (4, NUM_LABELS)
    assert outputs["loss"].shape == ()
    expected = torch.nn.functional.cross_entropy(outputs["logits"], labels)
    assert torch.allclose(outputs["loss"], expected)
    assert list(model(input_ids=input_ids)) == ["logits"]
    assert model.model_config["num_layers"] == 2 and model.model_config["d_model"] == 64
    assert model.model_config["num_heads"] == 4 and model.model_config["dropout"] == 0.1
    assert len(model.encoder.layers) == 2
    assert not hasattr(model, "config")  # transformers.Trainer would write model.config.use_cache


def test_model_output_ignores_padding():
    torch.manual_seed(0)
    model = TinyTransformerClassifier(vocab_size=50).eval()
    short = torch.tensor([[2, 10, 11, 12]])
    padded = torch.tensor([[2, 10, 11, 12, 0, 0, 0], [2, 13, 14, 15, 16, 17, 18]])
    mask = (padded != 0).long()
    with torch.no_grad():
        alone = model(input_ids=short)["logits"]
        in_batch = model(input_ids=padded, attention_mask=mask)["logits"]
    assert torch.allclose(alone[0], in_batch[0], atol=1e-5)


def test_model_refuses_sequences_longer_than_its_positions():
    model = TinyTransformerClassifier(vocab_size=10, max_position_embeddings=8)
    with pytest.raises(ValueError, match="max_position_embeddings=8"):
        model(input_ids=torch.ones(1, 9, dtype=torch.long))


def test_accuracy_metric():
    logits = np.array([[0.1, 0.9, 0.0, 0.0], [0.8, 0.1, 0.1, 0.0], [0.0, 0.0, 0.2, 0.7]])
    labels = np.array([1, 0, 2])
    assert accuracy_metric(SimpleNamespace(predictions=logits, label_ids=labels)) == {"accuracy": 2 / 3}
    extra = np.zeros((3, 5))
    assert accuracy_metric(SimpleNamespace(predictions=(logits, extra), label_ids=labels)) == {
        "accuracy": 2 / 3
    }


def test_saved_model_reloads_with_identical_outputs(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = TinyTransformerClassifier(vocab_size=30, dropout=0.2).eval()
    save_file(model.state_dict(), str(tmp_path / "model.safetensors"))
    model.save_config(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["id2label"] == {str(index): topic for index, topic in enumerate(TOPICS)}
    reloaded = TinyTransformerClassifier.from_pretrained(tmp_path).eval()
    assert reloaded.model_config == model.model_config
    input_ids = torch.randint(3, 30, (2, 6))
    assert torch.equal(model(input_ids=input_ids)["logits"], reloaded(input_ids=input_ids)["logits"])


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def test_build_embedded_run_gives_valid_reference_training_arguments(tmp_path):
    from transformers import TrainingArguments as ReferenceTrainingArguments

    from hf_lightning.args.training_args import TrainingArguments

    run = build_embedded_run(tmp_path, seed=3, max_steps=7)
    assert len(run["train_dataset"]) == 4000 and len(run["eval_dataset"]) == 400
    assert run["train_dataset"][0] == {
        "input_ids": run["tokenizer"].encode(generate_examples(1, 3, "train")[0]["text"])["input_ids"],
        "labels": generate_examples(1, 3, "train")[0]["label"],
    }
    kwargs = run["training_args"]
    assert kwargs["max_steps"] == 7 and kwargs["seed"] == 3 and kwargs["output_dir"] == str(tmp_path)
    assert kwargs["use_cpu"] is True and kwargs["report_to"] == "none" and kwargs["save_strategy"] == "no"
    ours, reference = TrainingArguments(**kwargs), ReferenceTrainingArguments(**kwargs)
    for name in kwargs:
        assert str(getattr(ours, name)) == str(getattr(reference, name)), name
    # The model's initial weights depend on the seed only, and building does not move the global RNG.
    state = torch.random.get_rng_state()
    again = build_embedded_run(tmp_path, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)
    for (name, first), (_, second) in zip(
        run["model"].state_dict().items(), again["model"].state_dict().items()
    ):
        assert torch.equal(first, second), name


def test_plain_pytorch_loop_learns_the_task_well_above_chance(one_thread):
    """The task is learnable in a few hundred steps without any trainer (250 AdamW steps, batch 32)."""
    run = build_embedded_run("unused", seed=0)
    model = run["model"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    loader = DataLoader(
        run["train_dataset"],
        batch_size=32,
        shuffle=True,
        collate_fn=run["data_collator"],
        generator=torch.Generator().manual_seed(0),
    )
    started = time.perf_counter()
    model.train()
    for _epoch in range(2):
        for batch in loader:
            loss = model(**batch)["loss"]
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    batch = run["data_collator"]([run["eval_dataset"][index] for index in range(len(run["eval_dataset"]))])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])["logits"]
    accuracy = accuracy_metric(SimpleNamespace(predictions=logits.numpy(), label_ids=batch["labels"].numpy()))
    print(f"plain loop: accuracy {accuracy['accuracy']:.3f} in {time.perf_counter() - started:.1f} s")
    assert accuracy["accuracy"] >= 0.85  # chance is 0.25


def test_embedded_module_needs_no_transformers():
    script = BLOCK_TRANSFORMERS + textwrap.dedent(
        """
        from hf_lightning.cli.embedded import build_embedded_run
        run = build_embedded_run("unused", train_size=10, eval_size=2)
        batch = run["data_collator"]([run["train_dataset"][0], run["train_dataset"][1]])
        assert run["model"](**batch)["logits"].shape == (2, 4)
        assert "transformers" not in sys.modules
        print("OK")
        """
    )
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "OK" in completed.stdout


# ---------------------------------------------------------------------------------------------
# The console script
# ---------------------------------------------------------------------------------------------


def test_cli_import_is_light_and_help_exits_zero():
    script = textwrap.dedent(
        """
        import sys
        import hf_lightning.cli.main as cli
        heavy = sorted({"torch", "lightning", "transformers"} & set(sys.modules))
        assert not heavy, heavy
        try:
            cli.main(["--help"])
        except SystemExit as exit:
            assert exit.code == 0
        print("OK")
        """
    )
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "train-demo" in completed.stdout and "explain" in completed.stdout and "OK" in completed.stdout


def test_cli_runs_train_demo_when_no_command_is_given():
    parser = cli.build_parser()
    for argv, command in [
        ([], "train-demo"),
        (["--epochs", "1"], "train-demo"),
        (["train-demo", "--seed", "3"], "train-demo"),
        (["explain", "a.json"], "explain"),
    ]:
        assert parser.parse_args(cli._with_default_command(argv)).command == command
    options = parser.parse_args(cli._with_default_command([]))
    assert (options.output_dir, options.seed, options.epochs, options.max_steps, options.num_threads) == (
        cli.DEFAULT_OUTPUT_DIR,
        42,
        None,
        None,
        1,
    )
    assert cli.TRAINER_CLASS == "hf_lightning.trainer.trainer:HFLightningTrainer"
    assert cli.TRAINING_ARGUMENTS_CLASS == "hf_lightning.args.training_args:TrainingArguments"


@pytest.mark.parametrize("argv", [["--max-steps", "0"], ["--epochs", "-1"], ["--num-threads", "0"], ["frob"]])
def test_cli_rejects_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(argv)
    assert exit.value.code == 2
    assert "error" in capsys.readouterr().err


def test_main_job_logic_with_the_reference_trainer(tmp_path, capsys, monkeypatch, one_thread):
    """The CLI's own logic (build, train, evaluate, save, summarise) driven by transformers.Trainer."""
    monkeypatch.setattr(cli, "TRAINER_CLASS", "transformers:Trainer")
    monkeypatch.setattr(cli, "TRAINING_ARGUMENTS_CLASS", "transformers:TrainingArguments")
    output_dir = tmp_path / "demo"
    assert cli.main(["--output-dir", str(output_dir), "--max-steps", "30", "--seed", "5"]) == 0
    out = capsys.readouterr().out
    assert "hf-lightning demo finished" in out and "eval accuracy" in out and "chance 25%" in out
    assert str((output_dir / "model.safetensors").resolve()) in out
    results = json.loads((output_dir / "demo_results.json").read_text())
    assert results["global_step"] == 30 and results["seed"] == 5
    assert results["chance_accuracy"] == CHANCE_ACCURACY
    model = TinyTransformerClassifier.from_pretrained(output_dir).eval()
    tokenizer = EmbeddedTokenizer.from_pretrained(output_dir)
    assert tokenizer.vocab == build_embedded_run("unused", seed=5)["tokenizer"].vocab
    dataset = build_embedded_run("unused", seed=5)["eval_dataset"]
    batch = EmbeddedCollator()([dataset[index] for index in range(len(dataset))])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])["logits"]
    reloaded_accuracy = (logits.argmax(-1) == batch["labels"]).sum().item() / len(dataset)
    assert reloaded_accuracy == pytest.approx(results["eval_accuracy"], abs=1e-9)


@pytest.mark.slow
def test_default_main_job_on_hf_lightning_without_transformers_learns_fast(tmp_path, monkeypatch, one_thread):
    """The issue's acceptance test: `hf-lightning` as a new user runs it, transformers not installed.

    It must finish in under 2 minutes on 2 CPU cores, save safetensors, and reach an accuracy well
    above chance, the same as the reference trainer reaches with the same script.
    """
    ours_dir, reference_dir = tmp_path / "ours", tmp_path / "reference"
    script = BLOCK_TRANSFORMERS + textwrap.dedent(
        f"""
        from hf_lightning.cli.main import main
        code = main(["--output-dir", {str(ours_dir)!r}])
        assert "transformers" not in sys.modules and "accelerate" not in sys.modules
        sys.exit(code)
        """
    )
    started = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    wall = time.perf_counter() - started
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert wall < 120, f"the main job took {wall:.1f} s"
    assert "%|" in completed.stderr + completed.stdout  # the progress bar was shown
    assert "hf-lightning demo finished" in completed.stdout
    assert {"model.safetensors", "config.json", "vocab.json"} <= {path.name for path in ours_dir.iterdir()}
    ours = json.loads((ours_dir / "demo_results.json").read_text())
    assert ours["eval_accuracy"] >= 0.85 and ours["global_step"] == 375

    monkeypatch.setattr(cli, "TRAINER_CLASS", "transformers:Trainer")
    monkeypatch.setattr(cli, "TRAINING_ARGUMENTS_CLASS", "transformers:TrainingArguments")
    assert cli.main(["--output-dir", str(reference_dir)]) == 0
    reference = json.loads((reference_dir / "demo_results.json").read_text())
    assert ours["train_loss"] == pytest.approx(reference["train_loss"], rel=1e-3)
    assert ours["eval_loss"] == pytest.approx(reference["eval_loss"], rel=1e-2)
    assert abs(ours["eval_accuracy"] - reference["eval_accuracy"]) <= 2 / 400  # at most two sentences apart


def test_explain_prints_one_line_per_field(tmp_path, capsys):
    path = tmp_path / "args.json"
    path.write_text(
        json.dumps({"output_dir": str(tmp_path), "learning_rate": 3e-4, "gradient_accumulation_steps": 2})
    )
    assert cli.main(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()[2:] if line.strip()}
    assert "0.0003" in lines["learning_rate"] and "honoured" in lines["learning_rate"]
    assert "gradient_accumulation_steps" in lines and "num_train_epochs" in lines


def test_explain_reports_refused_fields_with_exit_code_1(tmp_path, capsys):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"output_dir": str(tmp_path), "use_liger_kernel": True}))
    assert cli.main(["explain", str(path)]) == 1
    captured = capsys.readouterr()
    assert "refused" in captured.out and "use_liger_kernel" in captured.err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("[1, 2]", "JSON object"),
        ("{not json", "cannot read"),
        ('{"no_such_field": 1}', "no_such_field"),
    ],
)
def test_explain_rejects_bad_input_with_exit_code_2(tmp_path, capsys, content, message):
    path = tmp_path / "args.json"
    if content is not None:
        path.write_text(content)
    assert cli.main(["explain", str(path)]) == 2
    assert message in capsys.readouterr().err
