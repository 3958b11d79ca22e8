"""One process of a run on two nodes holding 2 + 1 processes (CPU, gloo), started by one of two torchrun agents
with different `--nproc_per_node`: train with hf_lightning (`ours`) or the reference (`ref`) and dump this rank's
view as JSON: the arguments' layout, Lightning's (ours), the dataset rows this process read, log history, weights."""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.models import ListDataset, make_tiny_gpt2, padded_lm_data  # noqa: E402


class RecordingDataset(ListDataset):
    """The rows this process read, in order (the dataloader reads in the main process: num_workers=0)."""

    def __init__(self, items: list[dict]):
        super().__init__(items)
        self.read: list[int] = []

    def __getitem__(self, index: int) -> dict:
        self.read.append(int(index))
        return super().__getitem__(index)


def main(side: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    kwargs = dict(
        output_dir=os.path.join(out_dir, side, f"node{os.environ['GROUP_RANK']}"),
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        per_device_train_batch_size=2,
        max_steps=2,
        logging_steps=1,
        learning_rate=1e-3,
        save_strategy="no",
        ddp_backend="gloo",
    )
    if side == "ref":
        import transformers

        trainer_cls, args = transformers.Trainer, transformers.TrainingArguments(**kwargs)
    else:
        from hf_lightning import Trainer, TrainingArguments

        trainer_cls, args = Trainer, TrainingArguments(**kwargs)
    dataset = RecordingDataset(padded_lm_data(14).items)
    trainer = trainer_cls(model=make_tiny_gpt2(), args=args, train_dataset=dataset)
    trainer.train()
    report = {
        "layout": [args.world_size, args.process_index, args.local_process_index, dist.get_world_size()],
        "read": dataset.read,
        "log_history": trainer.state.log_history,
        "weights": {k: v.detach().to(torch.float64).flatten().tolist() for k, v in trainer.model.state_dict().items()},
    }
    if side == "ours":
        lightning = trainer.lightning_trainer
        report["lightning"] = [lightning.world_size, lightning.global_rank, lightning.local_rank, lightning.node_rank]
    with open(os.path.join(out_dir, f"{side}_{dist.get_rank()}.json"), "w") as handle:
        json.dump(report, handle)


if __name__ == "__main__":
    from tests.distributed.teardown import end_worker

    main(sys.argv[1], sys.argv[2])
    end_worker()
