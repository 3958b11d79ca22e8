"""Run under `torch.distributed.run --nproc_per_node=2`: the shared tracker run (tests/integrations/
tracker_parity_run.py) with `report_to=["tensorboard", "dvclive"]` on two processes (gloo), each process in a
working directory of its own (`<side>/cwd` for rank 0, `<side>/cwd-rank1` for rank 1) and one `output_dir`.
Rank 0 reads back what the trackers stored; every rank reports whether its callbacks opened a writer and what it
left in its working directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.distributed.launching import write_rank_report  # noqa: E402
from tests.integrations import tracker_parity_run as parity  # noqa: E402

TRACKERS = ["tensorboard", "dvclive"]


def main(side: str, out_dir: str) -> None:
    import transformers

    from tests.models import make_regression_mlp, regression_data

    rank = int(os.environ["RANK"])
    root = Path(out_dir) / side
    cwd = root / ("cwd" if rank == 0 else f"cwd-rank{rank}")
    for name, value in parity.tracker_environment("dvclive", root).items():
        os.environ[name] = value
    cwd.mkdir(parents=True, exist_ok=True)
    os.chdir(cwd)
    parity._refuse_network()

    settings = {**parity.SETTINGS, "ddp_backend": "gloo", "report_to": TRACKERS}
    if side == "reference":
        args = transformers.TrainingArguments(output_dir=str(root / "out"), **settings)
        trainer_class = transformers.Trainer
    else:
        from hf_lightning import Trainer, TrainingArguments

        args = TrainingArguments(output_dir=str(root / "out"), **settings)
        trainer_class = Trainer
    transformers.set_seed(0)
    trainer = trainer_class(
        model=make_regression_mlp(), args=args, train_dataset=regression_data(16), eval_dataset=regression_data(4, seed=1)
    )
    trainer.train()
    trainer.evaluate()
    callbacks = {type(callback).__name__: callback for callback in trainer.callback_handler.callbacks}
    report = {
        "tensorboard_writer": callbacks["TensorBoardCallback"].tb_writer is not None,
        "dvclive_live": callbacks["DVCLiveCallback"].live is not None,
        "files_in_cwd": parity.files_written(cwd),
        "network_attempts": parity.ATTEMPTS,
    }
    if rank == 0:
        report["tensorboard"] = parity._normalise(parity.read_tensorboard(root), root)
        report["dvclive"] = parity._normalise(parity.read_dvclive(root), root)
    write_rank_report(out_dir, side, report)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
