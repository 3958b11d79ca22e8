"""The README as a newcomer reads it: the Quickstart and the TRL snippet run as written (no undefined names, TRL on
a CPU), the examples and the notebook say how to run them, names are spelled the same way everywhere, and the
argument table does not say "yes" to a field whose every value is refused."""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def python_block(heading: str) -> str:
    """The first ```python block after `heading`."""
    section = README[README.index(heading) :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("```\n", start)]


def bash_blocks() -> str:
    return "\n".join(re.findall(r"```bash\n(.*?)```", README, re.DOTALL))


def test_the_quickstart_runs_as_written(tmp_path, monkeypatch, capsys):
    import hf_lightning.cli.embedded as embedded

    monkeypatch.chdir(tmp_path)
    # The same code on a smaller data set (the README's run is the main job's size, about a minute).
    monkeypatch.setattr(
        embedded, "build_embedded_run", functools.partial(embedded.build_embedded_run, train_size=64, eval_size=32)
    )
    threads = torch.get_num_threads()
    try:
        exec(compile(python_block("## Quickstart"), "README.md (Quickstart)", "exec"), {"__name__": "__main__"})
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "'eval_accuracy'" in out and "per_device_train_batch_size" in out  # evaluate(), then explain()
    assert (tmp_path / "out").is_dir()


def test_the_trl_snippet_runs_on_a_cpu(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("sft_trl_example", ROOT / "examples" / "sft_trl.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = example.build_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, pad_token_id=tokenizer.pad_token_id,
    ))  # fmt: skip
    dataset = Dataset.from_dict({"messages": [
        [{"role": "user", "content": q}, {"role": "assistant", "content": a}] for q, a in example.QA
    ]})  # fmt: skip
    monkeypatch.chdir(tmp_path)
    scope = {"model": model, "dataset": dataset, "tokenizer": tokenizer}
    exec(compile(python_block("## TRL"), "README.md (TRL)", "exec"), scope)
    assert scope["trainer"].state.global_step > 0


def test_the_readme_says_how_to_run_the_examples_and_the_notebook():
    commands = bash_blocks()
    for command in ("python examples/train_classifier.py", "python examples/sft_trl.py", "notebooks/quickstart.ipynb"):
        assert command in commands, command
    assert "OMP_NUM_THREADS=1 python" in README  # a script of one's own with a tiny model


def test_names_are_spelled_the_same_in_the_readme_notebook_and_examples():
    notebook = (ROOT / "notebooks" / "quickstart.ipynb").read_text(encoding="utf-8")
    seq2seq = (ROOT / "examples" / "seq2seq.yaml").read_text(encoding="utf-8")
    assert "from hf_lightning import plot_log_history" in README and "from hf_lightning import plot_log_history" in notebook
    assert "trainer_class: hf_lightning.HFLightningSeq2SeqTrainer" in README
    assert "trainer_class: hf_lightning.HFLightningSeq2SeqTrainer\n" in seq2seq
    for text in (README, notebook, seq2seq):
        assert "hf_lightning.integrations.plotting import" not in text
        assert "hf_lightning.trainer.seq2seq.HFLightningSeq2SeqTrainer" not in text


def test_no_field_is_supported_when_every_value_of_it_is_refused():
    rows = re.findall(r"^\| `(\w+)` \| `[^`]*` \| ([^|]+) \| ([^|]+) \|$", README, re.MULTILINE)
    assert len(rows) > 100
    contradictions = [name for name, support, how in rows if support.strip() == "yes" and re.search(r":\s*refused\s*$", how)]
    assert not contradictions, contradictions
    assert ("debug", "default only") in [(name, support.strip()) for name, support, _ in rows]
