"""Manual check: GLiNER's own Trainer on hf_lightning against stock GLiNER (not in the test suite).

GLiNER declares `transformers<5.17`, so pip does not install it beside the transformers 5.24 the tests pin. Install
it without its dependencies into a scratch folder (its other imports are already there with the dev extra), then
run this file from the repository root:

    pip install --no-deps --target /tmp/gliner-pkg "gliner==0.2.29"
    PYTHONPATH=.:/tmp/gliner-pkg OMP_NUM_THREADS=1 python docs/manual_checks/gliner_on_lightning.py

Each side trains a GLiNER model with a tiny BERT backbone (built from a config, all-MiniLM-L6-v2's tokenizer) for
4 steps with checkpoints, in its own process; the script prints whether the log histories, the weights and the
checkpoint file names are equal, and exits non-zero when they are not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

DATA = [
    {"tokenized_text": ["John", "lives", "in", "Paris", "."], "ner": [[0, 0, "person"], [3, 3, "city"]]},
    {"tokenized_text": ["Mary", "visited", "Rome", "today"], "ner": [[0, 0, "person"], [2, 2, "city"]]},
] * 4


def train(side: str, backbone: str, out: str) -> None:
    import gliner.training.trainer as gliner_training
    import torch
    from gliner import GLiNER
    from gliner.config import GLiNERConfig

    if side == "ours":
        from hf_lightning import on_lightning

        trainer_cls, args_cls = on_lightning(gliner_training.Trainer, gliner_training.TrainingArguments)
    else:
        trainer_cls, args_cls = gliner_training.Trainer, gliner_training.TrainingArguments
    torch.manual_seed(0)
    config = GLiNERConfig(model_name=backbone, max_width=4, hidden_size=32, dropout=0.0)
    model = GLiNER.from_config(config, backbone_from_pretrained=True)
    args = args_cls(
        output_dir=out, max_steps=4, per_device_train_batch_size=2, learning_rate=1e-3, logging_steps=1, save_steps=2,
        use_cpu=True, report_to="none", seed=0, disable_tqdm=True,
    )
    trainer = trainer_cls(
        model=model, args=args, train_dataset=DATA, processing_class=model.data_processor.transformer_tokenizer,
        data_collator=model._create_data_collator(),
    )
    trainer.train()
    history = [{k: v for k, v in e.items() if "runtime" not in k and "per_second" not in k}
               for e in trainer.state.log_history]
    Path(out, "history.json").write_text(json.dumps(history))
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, Path(out, "weights.pt"))


def main() -> int:
    if len(sys.argv) == 4:
        train(*sys.argv[1:])
        return 0
    import torch

    from tests.adapted.st_harness import OUR_MARKER, tiny_model_dir

    root = Path(tempfile.mkdtemp())
    backbone = tiny_model_dir(root)
    for side in ("stock", "ours"):
        subprocess.run([sys.executable, __file__, side, backbone, str(root / side)], check=True, env=os.environ)
    same_history = json.loads((root / "stock/history.json").read_text()) == json.loads(
        (root / "ours/history.json").read_text()
    )
    stock, ours = torch.load(root / "stock/weights.pt"), torch.load(root / "ours/weights.pt")
    same_weights = list(stock) == list(ours) and all(torch.equal(stock[k], ours[k]) for k in stock)
    files = {side: sorted(p.name for p in (root / side / "checkpoint-4").iterdir() if p.name != OUR_MARKER)
             for side in ("stock", "ours")}
    print(f"log history equal: {same_history}; weights equal: {same_weights}; "
          f"checkpoint files equal: {files['stock'] == files['ours']}")
    return 0 if same_history and same_weights and files["stock"] == files["ours"] else 1


if __name__ == "__main__":
    sys.exit(main())
