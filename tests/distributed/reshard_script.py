"""Checkpoints across strategies and process counts (CPU, gloo): `python reshard_script.py PHASE CONFIGS OUT_DIR`,
under `torch.distributed.run --nproc_per_node=N` for the multi-process configurations (N=1 for `fsdp2_sharded_1`).

PHASE `source`: each configuration trains a tiny Llama 8 steps uninterrupted (checkpoint at step 4), then calls
`save_model()`. PHASE `resume`: each configuration resumes from every source's `checkpoint-4` found under OUT_DIR,
starting from other initial weights. The global batch is 4 everywhere, so every run computes the same updates.
Rank 0 writes `<phase>-<config>.json`: log history and final full weights per run.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.models import make_tiny_llama, padded_lm_data  # noqa: E402

VOCAB = 64
MAX_STEPS = 8
SAVE_STEPS = 4
GLOBAL_BATCH = 4
# name -> (processes, fsdp_config or "tp" or None)
CONFIGS = {
    "single": (1, None),
    "ddp_2": (2, None),
    "fsdp1_full_2": (2, {"version": 1, "state_dict_type": "FULL_STATE_DICT"}),
    "fsdp1_sharded_2": (2, {"version": 1, "state_dict_type": "SHARDED_STATE_DICT"}),
    "fsdp2_full_2": (2, {"version": 2, "state_dict_type": "FULL_STATE_DICT"}),
    "fsdp2_sharded_2": (2, {"version": 2, "state_dict_type": "SHARDED_STATE_DICT"}),
    "fsdp2_sharded_1": (1, {"version": 2, "state_dict_type": "SHARDED_STATE_DICT"}),
    "tp_2": (2, "tp"),
}
# The RNG rule: a model with dropout, saved by DDP on 2 processes, resumed on 2 (FSDP2) and on 1.
DROPOUT_SOURCE = "ddp_2"


def arguments(config: str, output_dir: str, dropout: bool = False):
    """The configuration's TrainingArguments for a run writing to `output_dir`."""
    from hf_lightning import TrainingArguments

    processes, layout = CONFIGS[config]
    data_parallel = processes if layout != "tp" else 1
    kwargs = dict(
        output_dir=output_dir,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        per_device_train_batch_size=GLOBAL_BATCH // data_parallel,
        max_steps=MAX_STEPS,
        logging_steps=1,
        learning_rate=3e-3,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        save_strategy="steps",
        save_steps=SAVE_STEPS,
        seed=7,
    )
    if processes > 1 or layout is not None:
        kwargs["ddp_backend"] = "gloo"
    if layout == "tp":
        from accelerate.parallelism_config import ParallelismConfig

        kwargs["parallelism_config"] = ParallelismConfig(tp_size=2)
    elif layout is not None:
        kwargs.update(fsdp="full_shard auto_wrap", fsdp_config=layout)
    return TrainingArguments(**kwargs)


def full_weights(trainer) -> dict:
    """The whole model's weights (gathered from shards), as float64 lists; rank 0's are the run's."""
    import torch

    from hf_lightning.strategies.fsdp.checkpoint import gather_full_state_dict
    from hf_lightning.strategies.fsdp.policies import is_fsdp1_model, is_fsdp2_model
    from hf_lightning.strategies.tensor_parallel.shards import full_state_dict, is_tp_sharded

    if is_fsdp1_model(trainer.model_wrapped) or is_fsdp2_model(trainer.model):
        state = gather_full_state_dict(trainer.model_wrapped)
    elif is_tp_sharded(trainer.model):
        state = full_state_dict(trainer.model)
    else:
        state = trainer.model.state_dict()
    return {key: value.detach().to(torch.float64).flatten().tolist() for key, value in state.items()}


def train(config: str, output_dir: str, resume: str | None, dropout: bool, seed: int) -> dict:
    from hf_lightning import Trainer

    trainer = Trainer(
        model=make_tiny_llama(seed=seed, dropout=0.2 if dropout else 0.0, vocab=VOCAB),
        args=arguments(config, output_dir, dropout),
        train_dataset=padded_lm_data(24, vocab=VOCAB),
    )
    trainer.train(resume_from_checkpoint=resume)
    result = {"log_history": trainer.state.log_history, "weights": full_weights(trainer)}
    if resume is None:
        trainer.save_model(os.path.join(output_dir, "final"))
    return result


def main(phase: str, configs: list[str], out_dir: str) -> None:
    for config in configs:
        results = {}
        if phase == "source":
            results["run"] = train(config, os.path.join(out_dir, "source", config), None, False, seed=0)
            if config == DROPOUT_SOURCE:
                results["dropout"] = train(
                    config, os.path.join(out_dir, "source", f"{config}-dropout"), None, True, seed=0
                )
        else:
            for source in CONFIGS:
                checkpoint = os.path.join(out_dir, "source", source, f"checkpoint-{SAVE_STEPS}")
                if os.path.isdir(checkpoint):
                    target_dir = os.path.join(out_dir, "resume", config, source)
                    results[source] = train(config, target_dir, checkpoint, False, seed=1)
            dropout_checkpoint = os.path.join(out_dir, "source", f"{DROPOUT_SOURCE}-dropout", f"checkpoint-{SAVE_STEPS}")
            if config in ("fsdp2_full_2", "single") and os.path.isdir(dropout_checkpoint):
                target_dir = os.path.join(out_dir, "resume", config, "dropout")
                results["dropout"] = train(config, target_dir, dropout_checkpoint, True, seed=1)
        if int(os.environ.get("RANK", "0")) == 0:
            with open(os.path.join(out_dir, f"{phase}-{config}.json"), "w") as handle:
                json.dump(results, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(","), sys.argv[3])
    if "RANK" in os.environ:
        from tests.distributed.teardown import end_worker

        end_worker()
