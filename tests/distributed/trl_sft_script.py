"""Run under `torch.distributed.run --nproc_per_node=2`: an SFT run with stock TRL (`stock`) or
hf_lightning.trl (`ours`) on gloo; rank 0 writes its log history, checkpoint file names and final weights."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.trl import harness, tiny  # noqa: E402


def main(side: str, out_dir: str) -> None:
    from safetensors.torch import save_file

    # Conversational data, two per process per step, gradient accumulation 2: TRL's token counts and metrics
    # are gathered across both processes (trainer.accelerator's gather_for_metrics).
    result = harness.run(
        side, Path(out_dir) / side, tiny.conversational_dataset(), per_device_train_batch_size=2,
        gradient_accumulation_steps=2, max_steps=3, save_steps=2, ddp_backend="gloo",
    )
    if result.trainer.args.process_index == 0:
        save_file({k: v.contiguous() for k, v in result.weights.items()}, str(Path(out_dir) / f"{side}.safetensors"))
        summary = {"log_history": result.log_history, "checkpoints": result.checkpoints,
                   "world_size": result.trainer.args.world_size}
        (Path(out_dir) / f"{side}.json").write_text(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
