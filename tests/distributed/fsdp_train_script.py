"""Run under `torch.distributed.run --nproc_per_node=2` (CPU, gloo): train FSDP scenarios with hf_lightning (`ours`)
or the reference (`ref`) and dump rank 0's log history, final weights and checkpoint files as JSON.

On CPU the reference ignores its FSDP plugin and trains with DDP (accelerate sets up FSDP only on accelerators);
it is given the FSDP2 form of each scenario's arguments, since its FSDP1 plugin refuses to build without a GPU.
FSDP, DDP and one process on the global batch compute the same updates, so the numbers must agree.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.distributed.launching import checkpoint_listing  # noqa: E402
from tests.models import (  # noqa: E402
    classification_data,
    make_tiny_bert_classifier,
    make_tiny_gpt2,
    padded_lm_data,
)

COMMON = {"gradient_accumulation_steps": 2, "max_steps": 4, "save_strategy": "steps", "save_steps": 2}
SCENARIOS = {
    # FSDP2 (the default), transformer wrap from BERT's _no_split_modules, full state dict checkpoints.
    "bert_v2_full": (make_tiny_bert_classifier, classification_data, {"version": 2}),
    # FSDP1 with the legacy wrapper, sharded (distributed checkpoint) files.
    "bert_v1_sharded": (
        make_tiny_bert_classifier,
        classification_data,
        {"version": 1, "state_dict_type": "SHARDED_STATE_DICT"},
    ),
    # GPT-2: tied embeddings go into FSDP2's tail unit; num_items_in_batch summed over ranks.
    "gpt2_v2_sharded": (
        make_tiny_gpt2,
        padded_lm_data,
        {"version": 2, "state_dict_type": "SHARDED_STATE_DICT"},
    ),
    # parallelism_config(dp_shard_size=2) without fsdp: FSDP2 with fsdp_config's defaults on the mesh, which
    # must be the reference's FSDP2 run of the same model (bert_v2_full).
    "bert_dp_shard": (make_tiny_bert_classifier, classification_data, None),
}
# Resumed from checkpoint-2 of a scenario above: steps 3 and 4 must repeat that run's.
RESUMED = {"bert_v1_sharded_resumed": "bert_v1_sharded", "gpt2_v2_sharded_resumed": "gpt2_v2_sharded"}
# The reference trains each model once: on CPU the FSDP options do not change what it runs (DDP).
REFERENCE_SCENARIOS = ("bert_v2_full", "gpt2_v2_sharded")


def _arguments(side: str, out_dir: str, name: str, fsdp_config: dict) -> object:
    kwargs = dict(
        output_dir=os.path.join(out_dir, side, name),
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        per_device_train_batch_size=2,
        logging_steps=1,
        learning_rate=1e-3,
        ddp_backend="gloo",
        **COMMON,
    )
    if fsdp_config is None:
        from accelerate.parallelism_config import ParallelismConfig

        kwargs["parallelism_config"] = ParallelismConfig(dp_shard_size=2)
    else:
        kwargs.update(fsdp="full_shard auto_wrap", fsdp_config=fsdp_config)
    if side == "ref":
        import transformers

        kwargs["fsdp_config"] = {**fsdp_config, "version": 2}
        return transformers.TrainingArguments(**kwargs)
    from hf_lightning import TrainingArguments

    return TrainingArguments(**kwargs)


def _full_weights(trainer, side: str) -> dict:
    """The whole model's weights on rank 0 (gathered from the shards under FSDP)."""
    import torch

    if side == "ours":
        from hf_lightning.strategies.fsdp.checkpoint import gather_full_state_dict

        state = gather_full_state_dict(trainer.model_wrapped)
    else:
        state = trainer.model.state_dict()
    return {key: value.detach().to(torch.float64).flatten().tolist() for key, value in state.items()}


def _is_fsdp2_model(model) -> bool:
    from hf_lightning.strategies.fsdp.policies import is_fsdp2_model

    return is_fsdp2_model(model)


def main(side: str, out_dir: str) -> None:
    results = {}
    names = list(SCENARIOS) + list(RESUMED) if side == "ours" else list(REFERENCE_SCENARIOS)
    for name in names:
        base = RESUMED.get(name, name)
        make_model, make_data, fsdp_config = SCENARIOS[base]
        args = _arguments(side, out_dir, name, fsdp_config)
        trainer_cls = (
            __import__("transformers").Trainer if side == "ref" else __import__("hf_lightning").Trainer
        )
        # A resumed run starts from other weights: the checkpoint must overwrite them.
        model = make_model(seed=1) if name in RESUMED else make_model()
        trainer = trainer_cls(model=model, args=args, train_dataset=make_data(14))
        resume = os.path.join(out_dir, side, base, "checkpoint-2") if name in RESUMED else None
        trainer.train(resume_from_checkpoint=resume)
        results[name] = {
            "log_history": trainer.state.log_history,
            "weights": _full_weights(trainer, side),
            "checkpoints": checkpoint_listing(args.output_dir),
            "strategy": type(trainer.lightning_trainer.strategy).__name__ if side == "ours" else None,
            "model_is_fsdp2": _is_fsdp2_model(trainer.model) if side == "ours" else None,
        }
    if int(os.environ.get("RANK", "0")) == 0:
        with open(os.path.join(out_dir, f"{side}.json"), "w") as handle:
            json.dump(results, handle)


if __name__ == "__main__":
    from tests.distributed.teardown import end_worker

    main(sys.argv[1], sys.argv[2])
    end_worker()
