"""A hub token given to the arguments never reaches a file under output_dir, a log record or the console."""

from __future__ import annotations

import logging

from hf_lightning import TrainingArguments
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.models import make_regression_mlp, regression_data

SECRET = b"secret-token-123"


def test_hub_token_is_written_nowhere(tmp_path, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    output_dir = tmp_path / "run"
    args = TrainingArguments(
        output_dir=str(output_dir),
        hub_token=SECRET.decode(),
        report_to=["csv", "tensorboard"],
        use_cpu=True,
        max_steps=2,
        per_device_train_batch_size=2,
        save_steps=1,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=1,
        log_level="debug",
    )
    data = regression_data(n=4)
    trainer = HFLightningTrainer(
        model=make_regression_mlp(), args=args, train_dataset=data, eval_dataset=data
    )
    print(repr(args), args.to_dict(), args.to_json_string())  # what a user's script commonly prints
    trainer.train()
    trainer.save_model()
    trainer.save_state()
    trainer.evaluate()

    files = [p for p in output_dir.rglob("*") if p.is_file()]
    # The token field itself is on disk, redacted to its placeholder (so the grep below checks real content).
    assert b"<HUB_TOKEN>" in (output_dir / "training_args.bin").read_bytes()
    assert any("events.out.tfevents" in p.name for p in files), sorted(p.name for p in files)
    leaks = [str(p.relative_to(output_dir)) for p in files if SECRET in p.read_bytes()]
    assert leaks == []

    captured = capsys.readouterr()
    assert captured.out  # something was printed
    assert SECRET not in captured.out.encode() + captured.err.encode()
    assert caplog.records  # DEBUG logs were captured
    assert SECRET not in caplog.text.encode()
    assert all(SECRET.decode() not in str(r.args) for r in caplog.records)
