"""`python device_launch_script.py OUT self` makes itself 2 ranks (hf_lightning.strategies.launch); under
`torchrun --nproc_per_node=2 ... OUT torchrun` the launcher does. Each rank dumps what it saw as JSON."""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def main(out_dir: str, mode: str) -> None:
    if mode == "self":
        from hf_lightning.strategies.launch import launch_over_devices

        launch_over_devices(2)  # what a plain run does by itself on a machine with 2 GPUs
    from hf_lightning import Trainer, TrainingArguments
    from tests.models import classification_data, make_tiny_bert_classifier

    args = TrainingArguments(
        output_dir=os.path.join(out_dir, mode),
        use_cpu=True,
        ddp_backend="gloo",
        report_to="none",
        disable_tqdm=True,
        per_device_train_batch_size=2,
        max_steps=4,
        logging_steps=1,
        save_strategy="no",
    )
    trainer = Trainer(model=make_tiny_bert_classifier(), args=args, train_dataset=classification_data(14))
    trainer.train()
    seen = {
        "world_size": args.world_size,
        "process_index": args.process_index,
        "log_history": trainer.state.log_history,
    }
    with open(os.path.join(out_dir, f"{mode}_rank{args.process_index}.json"), "w") as handle:
        json.dump(seen, handle)


if __name__ == "__main__":
    from tests.distributed.teardown import end_worker

    main(sys.argv[1], sys.argv[2])
    end_worker()
