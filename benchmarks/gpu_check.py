"""GPU check: a tiny BERT through each precision and strategy, with a resume from a checkpoint in each.

    python benchmarks/gpu_check.py                 # every case, one line each (about 5 minutes on one GPU)
    python benchmarks/gpu_check.py --cases bf16,fsdp2
    python benchmarks/gpu_check.py --cases parallelism_dp_shard   # one process per GPU, 2 GPUs or more
    python benchmarks/gpu_check.py --cases parallelism_tp         # tp_size = GPUs (2, 4 or 8), a tiny Llama

Each case runs in its own `torchrun --nproc_per_node=1` process (FSDP and DeepSpeed need a distributed
launch): train 6 steps saving at step 3, then a fresh trainer resumes from `checkpoint-3` and must end on
the uninterrupted run's training loss and weights. The fp16 case also checks the reference's
skipped-step rule: the scheduler lags the optimizer-step count by the steps the gradient scaler skipped.
Exit code 0 only when every case that ran passed; a case whose package is missing prints SKIP.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

_DEEPSPEED_AUTO = {
    "train_micro_batch_size_per_gpu": "auto",
    "train_batch_size": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "bf16": {"enabled": "auto"},
}
# ZeRO-2 without optimizer/scheduler sections: args.optim and lr_scheduler_type, the schedule stepped by us.
_ZERO2 = {**_DEEPSPEED_AUTO, "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}
# ZeRO-3 with DeepSpeed's optimizer and scheduler (stepped by the engine) and the 16-bit gather on save.
# torch_adam: DeepSpeed would otherwise JIT-compile FusedAdam (needs nvcc and ninja on the machine).
_ZERO3 = {
    **_DEEPSPEED_AUTO,
    "zero_optimization": {
        "stage": 3,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_gather_16bit_weights_on_model_save": True,
    },
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto", "torch_adam": True},
    },
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
            "total_num_steps": "auto",
        },
    },
}
_BERT_LAYERS = {"transformer_layer_cls_to_wrap": ["BertLayer"]}
# Stands for ParallelismConfig(dp_shard_size=WORLD_SIZE), built inside the worker (accelerate's class).
_DP_SHARD_ALL = "dp_shard_size=world_size"
# Stands for ParallelismConfig(tp_size=WORLD_SIZE): tensor parallelism over every GPU (a tiny Llama, whose
# transformers tp plan splits its attention and MLP projections).
_TP_ALL = "tp_size=world_size"
# Cases run with one process per visible GPU (the others with one process); fewer GPUs than this: SKIP.
MULTI_GPU_CASES = {"parallelism_dp_shard": 2, "parallelism_dp_shard_sharded": 2, "parallelism_tp": 2}

# case -> (extra TrainingArguments, package it needs or None)
CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "fp32": ({}, None),
    "bf16": ({"bf16": True}, None),
    "fp16": ({"fp16": True}, None),
    "fp16_full_eval": (
        {"fp16": True, "fp16_full_eval": True, "eval_strategy": "steps", "eval_steps": 3},
        None,
    ),
    "fsdp1": (
        {"bf16": True, "fsdp": "full_shard auto_wrap", "fsdp_config": {"version": 1, **_BERT_LAYERS}},
        None,
    ),
    "fsdp1_sharded_fp16": (
        {
            "fp16": True,
            "fsdp": "shard_grad_op auto_wrap",
            "fsdp_config": {"version": 1, "state_dict_type": "SHARDED_STATE_DICT", **_BERT_LAYERS},
        },
        None,
    ),
    "fsdp2": (
        {"bf16": True, "fsdp": "full_shard auto_wrap", "fsdp_config": {"version": 2, **_BERT_LAYERS}},
        None,
    ),
    "fsdp2_sharded_ac": (
        {
            "bf16": True,
            "fsdp": True,
            "fsdp_config": {"state_dict_type": "SHARDED_STATE_DICT", "activation_checkpointing": True},
        },
        None,
    ),
    # parallelism_config(dp_shard_size=every GPU): FSDP2 on ModelParallelStrategy's mesh, one process per GPU;
    # the sharded variant takes its checkpoint layout from fsdp_config. Both need 2 GPUs or more.
    "parallelism_dp_shard": ({"bf16": True, "parallelism_config": _DP_SHARD_ALL}, "accelerate"),
    "parallelism_dp_shard_sharded": (
        {
            "bf16": True,
            "parallelism_config": _DP_SHARD_ALL,
            "fsdp": True,
            "fsdp_config": {"state_dict_type": "SHARDED_STATE_DICT", **_BERT_LAYERS},
        },
        "accelerate",
    ),
    # parallelism_config(tp_size=every GPU): the Llama's tp plan on ModelParallelStrategy's mesh; checkpoints
    # hold the full weights (model.safetensors) and the gathered optimizer state (optimizer.pt).
    "parallelism_tp": ({"bf16": True, "parallelism_config": _TP_ALL}, "accelerate"),
    "deepspeed_zero2": ({"bf16": True, "gradient_accumulation_steps": 2, "deepspeed": _ZERO2}, "deepspeed"),
    "deepspeed_zero3": ({"bf16": True, "gradient_accumulation_steps": 2, "deepspeed": _ZERO3}, "deepspeed"),
}


# ---- worker (one case, inside torchrun) ----------------------------------------------------------------
def _tiny_bert():
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=128,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        num_labels=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(config)


def _tiny_llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,  # 8 query and key/value heads: tp_size 2, 4 or 8
        num_key_value_heads=8,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


def _lm_data(count: int = 96):
    import torch

    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 128, (count, 16), generator=generator)
    return [
        {"input_ids": ids[i], "attention_mask": torch.ones(16, dtype=torch.long), "labels": ids[i].clone()}
        for i in range(count)
    ]


def _data(count: int = 96):
    import torch

    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 128, (count, 16), generator=generator)
    labels = (ids[:, 0] % 2).long()
    return [
        {"input_ids": ids[i], "attention_mask": torch.ones(16, dtype=torch.long), "labels": labels[i]}
        for i in range(count)
    ]


class _ScaleWatch:
    """Counts the optimizer steps the fp16 gradient scaler skipped (its scale drops after `step()`)."""

    def __init__(self) -> None:
        self.trainer = None
        self.before: float | None = None
        self.skipped = 0

    def callback(self):
        from hf_lightning import TrainerCallback

        watch = self

        class Watch(TrainerCallback):
            def _scale(self) -> float | None:
                scaler = getattr(watch.trainer.lightning_trainer.precision_plugin, "scaler", None)
                return None if scaler is None else float(scaler.get_scale())

            def on_pre_optimizer_step(self, args, state, control, **kwargs):
                watch.before = self._scale()

            def on_optimizer_step(self, args, state, control, **kwargs):
                after = self._scale()
                if watch.before is not None and after is not None and after < watch.before:
                    watch.skipped += 1

        return Watch()


def _final_weights(trainer, output_dir: str) -> dict:
    """Whole-model weights on the CPU: gathered from the shards under FSDP, read from the consolidated
    `checkpoint-6/model.safetensors` under DeepSpeed (ZeRO-3 parameters are partitioned, empty tensors)."""
    if getattr(trainer, "is_fsdp_enabled", False):
        from hf_lightning.strategies.fsdp.checkpoint import gather_full_state_dict

        state = gather_full_state_dict(trainer.model_wrapped)
    elif trainer.get_tp_size() > 1:  # every rank gathers the DTensor shards
        from hf_lightning.strategies.tensor_parallel.shards import full_state_dict

        state = full_state_dict(trainer.model)
    elif getattr(trainer, "is_deepspeed_enabled", False):
        from safetensors.torch import load_file

        state = load_file(os.path.join(output_dir, "checkpoint-6", "model.safetensors"))
    else:
        state = trainer.model.state_dict()
    return {k: v.detach().float().cpu() for k, v in state.items()}


def run_case(name: str, out_dir: str) -> dict[str, Any]:
    import torch

    from hf_lightning import Trainer, TrainingArguments

    extra, _ = CASES[name]
    if extra.get("parallelism_config") == _DP_SHARD_ALL:
        from accelerate.parallelism_config import ParallelismConfig

        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        extra = {**extra, "parallelism_config": ParallelismConfig(dp_shard_size=world_size)}
    tensor_parallel = extra.get("parallelism_config") == _TP_ALL
    if tensor_parallel:
        from accelerate.parallelism_config import ParallelismConfig

        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        extra = {**extra, "parallelism_config": ParallelismConfig(tp_size=world_size)}
    make_model, make_data = (_tiny_llama, _lm_data) if tensor_parallel else (_tiny_bert, _data)
    common = dict(
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        max_steps=6,
        save_steps=3,
        logging_steps=1,
        learning_rate=1e-3,
        report_to="none",
        disable_tqdm=True,
        seed=0,
        **extra,
    )
    watch = _ScaleWatch()

    def build(output_dir: str):
        trainer = Trainer(
            model=make_model(),
            args=TrainingArguments(output_dir=output_dir, **common),
            train_dataset=make_data(),
            eval_dataset=make_data(32),
            callbacks=[watch.callback()],
        )
        watch.trainer = trainer
        return trainer

    started = time.perf_counter()
    full = build(os.path.join(out_dir, "full"))
    full_output = full.train()
    skipped = watch.skipped
    scheduler_steps = getattr(full.lr_scheduler, "last_epoch", None)
    full_weights = _final_weights(full, os.path.join(out_dir, "full"))
    resumed = build(os.path.join(out_dir, "resumed"))
    resumed_output = resumed.train(resume_from_checkpoint=os.path.join(out_dir, "full", "checkpoint-3"))
    resumed_weights = _final_weights(resumed, os.path.join(out_dir, "resumed"))
    max_weight_diff = max((full_weights[k] - resumed_weights[k]).abs().max().item() for k in full_weights)
    result = {
        "case": name,
        "seconds": round(time.perf_counter() - started, 1),
        "global_step": full.state.global_step,
        "train_loss": full_output.training_loss,
        "resumed_train_loss_tail": [e["loss"] for e in resumed.state.log_history if "loss" in e][-3:],
        "full_train_loss_tail": [e["loss"] for e in full.state.log_history if "loss" in e][-3:],
        "max_weight_diff": max_weight_diff,
        "resumed_global_step": resumed.state.global_step,
        "skipped_steps": skipped,
        "scheduler_steps": scheduler_steps,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "wrapped": type(full.model_wrapped).__name__,
        "engine_steps": getattr(full.model_wrapped, "global_steps", None),
        "checkpoint_3": sorted(os.listdir(os.path.join(out_dir, "full", "checkpoint-3"))),
    }
    del resumed_output
    return result


def judge(result: dict[str, Any]) -> list[str]:
    """What is wrong with a case's result (empty when it passed)."""
    problems = []
    if result["global_step"] != 6 or result["resumed_global_step"] != 6:
        problems.append(f"steps {result['global_step']}/{result['resumed_global_step']} != 6")
    if not math.isfinite(result["train_loss"]):
        problems.append("non-finite training loss")
    for full, resumed in zip(result["full_train_loss_tail"], result["resumed_train_loss_tail"]):
        if not math.isclose(full, resumed, rel_tol=2e-2, abs_tol=1e-3):
            problems.append(f"resumed loss {resumed:.5f} != uninterrupted {full:.5f}")
            break
    if result["max_weight_diff"] > 5e-2:
        problems.append(f"resumed weights differ by {result['max_weight_diff']:.3g}")
    if result["scheduler_steps"] is not None and result["case"].startswith("fp16"):
        if result["scheduler_steps"] != result["global_step"] - result["skipped_steps"]:
            problems.append(
                f"scheduler stepped {result['scheduler_steps']} times, expected {result['global_step']} - "
                f"{result['skipped_steps']} skipped"
            )
    files = set(result["checkpoint_3"])
    if result["case"].startswith("deepspeed"):
        if result["wrapped"] != "DeepSpeedEngine" or result["engine_steps"] != 6:
            problems.append(
                f"model_wrapped {result['wrapped']} stepped {result['engine_steps']} times, not 6"
            )
        if not {"global_step3", "latest", "zero_to_fp32.py", "model.safetensors"} <= files:
            problems.append(f"checkpoint-3 holds {sorted(files)}")
    if result["case"] == "parallelism_tp":
        if result["wrapped"] != "LlamaForCausalLM" or not {"model.safetensors", "optimizer.pt"} <= files:
            problems.append(f"model_wrapped {result['wrapped']}, checkpoint-3 holds {sorted(files)}")
    elif result["case"].startswith(("fsdp", "parallelism")):
        expected = "pytorch_model_fsdp_0" if "sharded" in result["case"] else "pytorch_model_fsdp.bin"
        if expected not in files:
            problems.append(f"checkpoint-3 lacks {expected}: {sorted(files)}")
    return problems


# ---- driver ----------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cases", default=",".join(CASES), help="comma-separated subset of: " + ", ".join(CASES)
    )
    parser.add_argument("--case", help=argparse.SUPPRESS)  # worker mode
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per case")
    options = parser.parse_args(argv)
    if options.case:
        result = run_case(options.case, options.out)
        if int(os.environ.get("RANK", "0")) == 0:
            Path(options.out, "result.json").write_text(json.dumps(result))
        return 0

    import torch

    if not torch.cuda.is_available():
        print("FAIL no CUDA device: this script checks the GPU paths")
        return 1
    failures = 0
    for name in options.cases.split(","):
        extra, package = CASES[name]
        if package and importlib.util.find_spec(package) is None:
            print(f"SKIP {name}: the {package} package is not installed")
            continue
        processes = 1
        if name in MULTI_GPU_CASES:
            processes = torch.cuda.device_count()
            if processes < MULTI_GPU_CASES[name]:
                print(f"SKIP {name}: needs {MULTI_GPU_CASES[name]} GPUs, this machine has {processes}")
                continue
        with tempfile.TemporaryDirectory() as out:
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nproc_per_node={processes}",
                f"--master_port={_free_port()}",
                __file__,
                "--case",
                name,
                "--out",
                out,
            ]
            try:
                completed = subprocess.run(
                    command, cwd=REPO, capture_output=True, text=True, timeout=options.timeout
                )
            except subprocess.TimeoutExpired:
                failures += 1
                print(f"FAIL {name}: over {options.timeout} s")
                continue
            result_file = Path(out, "result.json")
            if completed.returncode != 0 or not result_file.exists():
                failures += 1
                last = (completed.stderr or completed.stdout).strip().splitlines()[-1:] or ["no output"]
                print(f"FAIL {name}: exit {completed.returncode}: {last[0][:300]}")
                continue
            result = json.loads(result_file.read_text())
        problems = judge(result)
        failures += bool(problems)
        status = "PASS" if not problems else "FAIL"
        detail = (
            "; ".join(problems)
            if problems
            else (
                f"loss {result['train_loss']:.4f}, resume max weight diff {result['max_weight_diff']:.2g}, "
                f"skipped {result['skipped_steps']}, {result['seconds']} s"
            )
        )
        print(f"{status} {name}: {detail}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
