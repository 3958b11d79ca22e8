"""The first checkpoint save of a process does not import deepspeed when the run does not use it."""

import json
import subprocess
import sys
import textwrap


def test_first_save_imports_no_deepspeed_and_restores_accelerate(tmp_path):
    script = textwrap.dedent(
        f"""
        import json, sys
        import torch
        from transformers import BertConfig, BertForSequenceClassification
        import accelerate.utils.other as other
        from hf_lightning import Trainer, TrainingArguments

        torch.manual_seed(0)
        config = BertConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2,
                            intermediate_size=16, vocab_size=64)
        model = BertForSequenceClassification(config)
        original = other.is_deepspeed_available
        args = TrainingArguments({str(tmp_path / "out")!r}, report_to=[], use_cpu=True)
        trainer = Trainer(model=model, args=args)
        trainer.save_model()
        loaded = "deepspeed" in sys.modules
        restored = other.is_deepspeed_available is original
        import deepspeed  # now deepspeed is loaded: the probe must find DeepSpeedEngine again
        from accelerate.utils import extract_model_from_parallel
        trainer.save_model({str(tmp_path / "again")!r})
        print(json.dumps({{"deepspeed_loaded": loaded, "restored": restored,
                          "available": other.is_deepspeed_available()}}))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"deepspeed_loaded": False, "restored": True, "available": True}
    first = (tmp_path / "out" / "model.safetensors").read_bytes()
    assert first == (tmp_path / "again" / "model.safetensors").read_bytes()


def test_nested_probe_patches_once(monkeypatch):
    import accelerate.utils.other as other

    from hf_lightning.checkpoint.save_imports import deepspeed_probe_skipped_while_unloaded

    monkeypatch.delitem(sys.modules, "deepspeed", raising=False)
    original = other.is_deepspeed_available
    with deepspeed_probe_skipped_while_unloaded():
        with deepspeed_probe_skipped_while_unloaded():
            assert other.is_deepspeed_available() is False
        assert other.is_deepspeed_available is not original
    assert other.is_deepspeed_available is original
