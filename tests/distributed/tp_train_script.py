"""Tensor parallelism: `ours` runs under `torch.distributed.run --nproc_per_node=2` (CPU, gloo) with
parallelism_config(tp_size=2); `ref` is the reference's one-process run (transformers.Trainer, `python script ref`).
Rank 0 dumps log histories, eval metrics, final weights and checkpoint listings as JSON.

Tensor parallelism over every process is one data-parallel replica, so both must compute the same run.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.distributed.launching import checkpoint_listing  # noqa: E402
from tests.models import make_tiny_llama, padded_lm_data  # noqa: E402

VOCAB = 64
COMMON = dict(
    per_device_train_batch_size=2,
    per_device_eval_batch_size=2,
    gradient_accumulation_steps=2,
    max_steps=4,
    logging_steps=1,
    learning_rate=3e-3,
    save_strategy="steps",
    save_steps=2,
    eval_strategy="steps",
    eval_steps=2,
    # The best checkpoint (by eval_loss) is loaded back at the end: full weights into the DTensor shards.
    load_best_model_at_end=True,
    metric_for_best_model="eval_loss",
    use_cpu=True,
    report_to="none",
    disable_tqdm=True,
)


def count_predictions(prediction) -> dict:
    """How many eval rows arrived (duplicated rows would show), and a value of the predictions themselves."""
    import numpy as np

    logits = prediction.predictions
    return {"rows": float(len(logits)), "logit_mean": float(np.mean(logits))}


def _arguments(side: str, out_dir: str, name: str):
    kwargs = dict(output_dir=os.path.join(out_dir, side, name), **COMMON)
    if side == "ref":
        import transformers

        return transformers.TrainingArguments(**kwargs)
    from accelerate.parallelism_config import ParallelismConfig

    from hf_lightning import TrainingArguments

    return TrainingArguments(**kwargs, ddp_backend="gloo", parallelism_config=ParallelismConfig(tp_size=2))


def _weights(trainer, side: str) -> dict:
    import torch

    if side == "ours":
        from hf_lightning.strategies.tensor_parallel.shards import full_state_dict

        state = full_state_dict(trainer.model)
    else:
        state = trainer.model.state_dict()
    return {key: value.detach().to(torch.float64).flatten().tolist() for key, value in state.items()}


def main(side: str, out_dir: str) -> None:
    trainer_cls = __import__("transformers").Trainer if side == "ref" else __import__("hf_lightning").Trainer
    # "tied": the LM head shares the embedding's weight (tie_word_embeddings), which stays shared once split.
    names = ["run", "resumed", "tied"] if side == "ours" else ["run", "tied"]
    results = {}
    for name in names:
        args = _arguments(side, out_dir, name)
        # The resumed run starts from other weights: the checkpoint must replace them.
        model = make_tiny_llama(seed=1 if name == "resumed" else 0, tied=name == "tied")
        trainer = trainer_cls(
            model=model,
            args=args,
            train_dataset=padded_lm_data(14, vocab=VOCAB),
            eval_dataset=padded_lm_data(5, seed=3, vocab=VOCAB),
            compute_metrics=count_predictions,
        )
        resume = os.path.join(out_dir, side, "run", "checkpoint-2") if name == "resumed" else None
        trainer.train(resume_from_checkpoint=resume)
        final_eval = trainer.evaluate()
        result = {
            "log_history": trainer.state.log_history,
            "final_eval": final_eval,
            "weights": _weights(trainer, side),
            "checkpoints": checkpoint_listing(args.output_dir),
        }
        if side == "ours":
            from torch.distributed.tensor import DTensor

            result["strategy"] = type(trainer.lightning_trainer.strategy).__name__
            result["tp_size"] = trainer.get_tp_size()
            result["dtensor_parameters"] = sum(isinstance(p, DTensor) for p in trainer.model.parameters())
            result["tied_after_split"] = (
                trainer.model.lm_head.weight is trainer.model.model.embed_tokens.weight
            )
            result["total_train_batch_size"] = trainer.get_total_train_batch_size(trainer.args)
            if name == "run":  # this rank's accelerator view of the mesh, one file per rank
                accelerator = trainer.accelerator
                mesh = accelerator.torch_device_mesh
                facts = {
                    "process_index": accelerator.process_index,
                    "tensor_parallel_rank": accelerator.tensor_parallel_rank,
                    "data_parallel_shard_rank": accelerator.data_parallel_shard_rank,
                    "data_parallel_rank": accelerator.data_parallel_rank,
                    "mesh": None if mesh is None else dict(zip(mesh.mesh_dim_names, mesh.shape)),
                }
                with open(os.path.join(out_dir, f"accelerator-{accelerator.process_index}.json"), "w") as handle:
                    json.dump(facts, handle)
        results[name] = result
    if side == "ours":
        # GPT-2 has no tensor-parallel plan in transformers: refused when the Trainer is built.
        from tests.models import make_tiny_gpt2

        try:
            data = padded_lm_data(4, vocab=VOCAB)
            trainer_cls(
                model=make_tiny_gpt2(),
                args=_arguments(side, out_dir, "gpt2"),
                train_dataset=data,
                eval_dataset=data,
            )
        except ValueError as error:
            results["gpt2_refusal"] = str(error)
    if int(os.environ.get("RANK", "0")) == 0:
        with open(os.path.join(out_dir, f"{side}.json"), "w") as handle:
            json.dump(results, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    if sys.argv[1] == "ours":
        from tests.distributed.teardown import end_worker

        end_worker()
