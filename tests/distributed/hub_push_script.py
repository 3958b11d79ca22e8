"""Run under `torch.distributed.run --nproc_per_node=2`: train with the reference (`ref`) or hf_lightning (`ours`),
pushing to the Hub of HF_ENDPOINT with hub_strategy="checkpoint", then call push_to_hub() on every rank.

Ranks other than 0 run with HF_HUB_OFFLINE=1 and a dead endpoint, so any Hub request they made would fail the run.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

if int(os.environ.get("RANK", "0")) != 0:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"

from tests.integrations.hub_server import WaitForPushes  # noqa: E402
from tests.models import classification_data, make_tiny_bert_classifier  # noqa: E402


def main(side: str, out_dir: str, repo_id: str) -> None:
    if side == "ref":
        import transformers as module
    else:
        import hf_lightning as module
    args = module.TrainingArguments(
        output_dir=out_dir, use_cpu=True, report_to="none", disable_tqdm=True, per_device_train_batch_size=2,
        max_steps=2, save_strategy="steps", save_steps=2, logging_steps=1, ddp_backend="gloo", push_to_hub=True,
        hub_model_id=repo_id, hub_strategy="checkpoint",
    )
    callback = WaitForPushes()
    trainer = module.Trainer(
        model=make_tiny_bert_classifier(), args=args, train_dataset=classification_data(8), callbacks=[callback]
    )
    callback.trainer = trainer
    trainer.train()
    trainer.push_to_hub()


if __name__ == "__main__":
    from tests.distributed.teardown import end_worker

    main(*sys.argv[1:4])
    end_worker()
