"""Run under `torch.distributed.run --nproc_per_node=2`: train the same scenarios with the reference
(`ref`) or hf_lightning (`ours`) and dump rank 0's log history and final weights as JSON."""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.models import (  # noqa: E402
    classification_data,
    make_tiny_bert_classifier,
    make_tiny_gpt2,
    padded_lm_data,
)

SCENARIOS = {
    # BERT's loss counts as scaled: x GA and x world size in the reference (R4.6), reproduced.
    "bert_ga2": (make_tiny_bert_classifier, classification_data, {"gradient_accumulation_steps": 2}),
    # GPT-2: num_items_in_batch summed over both ranks (R4.4), last window of the epoch shorter.
    "gpt2_ga2": (make_tiny_gpt2, padded_lm_data, {"gradient_accumulation_steps": 2}),
    # Checkpoints under DDP: one folder per save, an RNG file per rank.
    "bert_checkpoints": (make_tiny_bert_classifier, classification_data, {"save_strategy": "steps", "save_steps": 2}),
}


def _summary(trainer, output_dir: str) -> dict:
    """Log history, final weights (float64 lists) and each checkpoint folder's file names."""
    import torch

    state = {k: v.detach().to(torch.float64).flatten().tolist() for k, v in trainer.model.state_dict().items()}
    folders = {}
    for folder in sorted(os.listdir(output_dir)):
        path = os.path.join(output_dir, folder)
        if folder.startswith("checkpoint-") and os.path.isdir(path):
            folders[folder] = sorted(os.listdir(path))
    return {"log_history": trainer.state.log_history, "weights": state, "checkpoints": folders}


def main(side: str, out_dir: str) -> None:
    results = {}
    for name, (make_model, make_data, extra) in SCENARIOS.items():
        kwargs = dict(
            output_dir=os.path.join(out_dir, side, name), use_cpu=True, report_to="none", disable_tqdm=True,
            per_device_train_batch_size=2, num_train_epochs=2, logging_steps=1, learning_rate=1e-3,
            ddp_backend="gloo", **{"save_strategy": "no", **extra},
        )
        if side == "ref":
            import transformers

            trainer_cls, args = transformers.Trainer, transformers.TrainingArguments(**kwargs)
        else:
            from hf_lightning import Trainer, TrainingArguments

            trainer_cls, args = Trainer, TrainingArguments(**kwargs)
        trainer = trainer_cls(model=make_model(), args=args, train_dataset=make_data(14))
        trainer.train()
        results[name] = _summary(trainer, kwargs["output_dir"])
        if name == "bert_checkpoints" and side == "ours":
            # The same run with background checkpoint writes: each rank writes its part in its writer thread.
            from lightning.pytorch.plugins.io import AsyncCheckpointIO

            async_kwargs = {**kwargs, "output_dir": os.path.join(out_dir, side, "bert_checkpoints_async")}
            background = trainer_cls(model=make_model(), args=type(args)(**async_kwargs), train_dataset=make_data(14))
            background.lightning_trainer_overrides = {"plugins": [AsyncCheckpointIO()]}
            background.train()
            results["bert_checkpoints_async"] = _summary(background, async_kwargs["output_dir"])
        if name == "bert_checkpoints":
            # Resume under DDP from the mid-epoch checkpoint of this run, into a fresh output folder.
            kwargs["output_dir"] = os.path.join(out_dir, side, "bert_resume")
            args = type(args)(**kwargs)
            resumed = trainer_cls(model=make_model(), args=args, train_dataset=make_data(14))
            resumed.train(resume_from_checkpoint=os.path.join(out_dir, side, name, "checkpoint-2"))
            results["bert_resume"] = _summary(resumed, kwargs["output_dir"])
    if int(os.environ.get("RANK", "0")) == 0:
        with open(os.path.join(out_dir, f"{side}.json"), "w") as handle:
            json.dump(results, handle)


if __name__ == "__main__":
    from tests.distributed.teardown import end_worker

    main(sys.argv[1], sys.argv[2])
    end_worker()
