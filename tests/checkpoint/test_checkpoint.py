"""Checkpoint saving: reference layout and contents, atomic commit, completeness, rotation, best model, metrics files.

The reference (transformers 5.24) is the oracle wherever a comparison is possible: its `rotate_checkpoints`,
`_determine_best_metric`, `log_metrics` / `save_metrics` and the checkpoint folders of a real `transformers.Trainer`
run. Until the facade can be imported, a small stand-in object carries the attributes the mixin needs.
"""

from __future__ import annotations

import copy
import io
import json
import logging
import os
import random
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import safetensors.torch
import torch

import hf_lightning.checkpoint.files as checkpoint_files
from hf_lightning.callbacks import ExportableState, TrainerCallback, TrainerControl, TrainerState
from hf_lightning.checkpoint.checkpointer import Checkpointer
from hf_lightning.checkpoint.fault_points import SAVE_POINTS, fault_hook
from hf_lightning.checkpoint.files import (
    checkpoints_to_delete,
    checkpoints_to_delete_at_train_end,
    get_last_checkpoint,
    is_complete_checkpoint,
)
from hf_lightning.checkpoint.staging import training_args_to_plain_dict
from hf_lightning.core.checkpoint_files import COMPLETE_MARKER_NAME, numpy_safe_globals
from hf_lightning.trainer.checkpoint_methods import CheckpointMixin
from hf_lightning.translation.translate import translate
from tests.models import make_regression_mlp, make_tiny_bert_classifier, regression_data

REFERENCE_FILES_PLAIN = [
    "model.safetensors",
    "optimizer.pt",
    "rng_state.pth",
    "scheduler.pt",
    "trainer_state.json",
    "training_args.bin",
]


# ---- fixtures ------------------------------------------------------------------------------------------------


def reference_args(output_dir, **kwargs):
    import transformers

    defaults = {"use_cpu": True, "report_to": "none", "disable_tqdm": True}
    return transformers.TrainingArguments(output_dir=str(output_dir), **{**defaults, **kwargs})


class CountingCallback(TrainerCallback, ExportableState):
    """An exportable callback whose state changes at every step."""

    def __init__(self, start: int = 0):
        self.count = start

    def on_step_end(self, args, state, control, **kwargs):
        self.count += 1

    def state(self) -> dict:
        return {"args": {"start": 0}, "attributes": {"count": self.count}}


class StandIn(CheckpointMixin):
    """The attributes of the trainer facade that the checkpoint mixin reads."""

    def __init__(
        self, args, model=None, *, processing_class=None, callbacks=(), optimizer=None, lr_scheduler=None
    ):
        self.args = args
        self.plan = translate(args)  # the checkpoint I/O of its strategy (strategies/build.py)
        self._training_run = None
        self._telemetry = None  # the telemetry is off (core/blocked_time.py reads it)
        self._checkpointer = Checkpointer(self)
        self.model = model if model is not None else make_regression_mlp()
        self.model_wrapped = self.model
        if getattr(self.model, "config", None) is not None:
            # As the facade's constructor does (and the reference's).
            self.model.config.use_cache = args.use_cache
        self.state = TrainerState()
        self.control = TrainerControl()
        self.callback_handler = SimpleNamespace(callbacks=list(callbacks))
        self.optimizer = optimizer or torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.lr_scheduler = lr_scheduler or torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: 1.0
        )
        self.processing_class = processing_class
        self.data_collator = None
        self.hp_search_backend = None
        self.hp_name = None
        self.lightning_trainer = None
        self.store_flos_calls = 0

    def store_flos(self) -> None:
        self.store_flos_calls += 1

    def is_world_process_zero(self) -> bool:
        return True

    def save_at(self, step: int, best_step: int | None = None) -> None:
        self.state.global_step = step
        if best_step is not None:
            self.state.best_global_step = best_step
        self._save_checkpoint(self.model, None)


def listing(folder) -> list[str]:
    return sorted(os.listdir(folder))


def checkpoint_steps(folder) -> list[int]:
    return [step for step, _ in checkpoint_files.list_checkpoints(str(folder))]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """A real `transformers.Trainer` run: save_steps=1, max_steps=2, two exportable callbacks, a hub token."""
    import transformers
    from transformers.trainer_callback import ExportableState as ReferenceExportableState

    class ReferenceCounting(transformers.TrainerCallback, ReferenceExportableState):
        def __init__(self, start: int = 0):
            self.count = start

        def on_step_end(self, args, state, control, **kwargs):
            self.count += 1

        def state(self) -> dict:
            return {"args": {"start": 0}, "attributes": {"count": self.count}}

    output_dir = tmp_path_factory.mktemp("reference")
    args = reference_args(output_dir, save_steps=1, max_steps=2, hub_token="secret")
    trainer = transformers.Trainer(
        model=make_regression_mlp(),
        args=args,
        train_dataset=regression_data(),
        callbacks=[ReferenceCounting(), ReferenceCounting()],
    )
    trainer.train()
    return SimpleNamespace(trainer=trainer, output_dir=output_dir, args=args)


# ---- rotation: the pure rule -----------------------------------------------------------------------------------


def _paths(steps):
    return [(step, f"/run/checkpoint-{step}") for step in steps]


ROTATION_TABLE = [
    # id, existing steps, limit, best step, newest step (None: highest), expected deleted steps
    ("no limit", [1, 2, 3], None, None, None, []),
    ("limit 0 keeps all", [1, 2, 3], 0, None, None, []),
    ("under the limit", [1, 2], 2, None, None, []),
    ("oldest go first", [1, 2, 3, 4], 2, None, None, [1, 2]),
    ("best kept beside newest", [1, 2, 3, 4], 2, 2, None, [1, 3]),
    # PR #11748: the best was swapped with the newest and the newest was deleted instead of the oldest.
    ("newest never deleted (PR 11748)", [1, 2, 3, 4, 5], 3, 1, None, [2, 3]),
    # Issue #15089 / #39476: the best checkpoint was deleted by rotation.
    ("best far from the end kept (issue 39476)", [3, 6, 9, 12, 15, 18], 2, 6, None, [3, 9, 12, 15]),
    ("best is newest", [1, 2, 3], 2, 3, None, [1]),
    ("limit 1 without best", [1, 2], 1, None, None, [1]),
    # save_total_limit=1 with a best older than the newest keeps both (the reference's documented rule).
    ("limit 1 keeps best and newest", [1, 2, 3], 1, 1, None, [2]),
    ("limit 1, best is newest", [1, 2, 3], 1, 3, None, [1, 2]),
    ("best not on disk still counts as protected", [1, 2, 3], 1, 9, None, [1]),
    # A fresh run writing checkpoint-100 next to leftovers of a longer run: the new folder is the most recent.
    ("just written is newest", [100, 500, 1000], 2, None, 100, [500]),
    ("just written is newest, limit 1", [100, 500, 1000], 1, None, 100, [500, 1000]),
]


@pytest.mark.parametrize(
    "existing, limit, best, newest, expected",
    [row[1:] for row in ROTATION_TABLE],
    ids=[row[0] for row in ROTATION_TABLE],
)
def test_checkpoints_to_delete_table(existing, limit, best, newest, expected):
    best_path = None if best is None else f"/run/checkpoint-{best}"
    newest_path = None if newest is None else f"/run/checkpoint-{newest}"
    deleted = checkpoints_to_delete(_paths(existing), limit, best_path, newest=newest_path)
    assert deleted == [f"/run/checkpoint-{step}" for step in expected]


def test_best_matched_whatever_its_spelling():
    relative = os.path.relpath("/run/checkpoint-2")
    deleted = checkpoints_to_delete(_paths([1, 2, 3]), 1, relative + "/")
    assert deleted == ["/run/checkpoint-1"]


def test_rotation_never_deletes_best_or_newest_and_keeps_the_count():
    generator = random.Random(0)
    for _ in range(500):
        steps = sorted(generator.sample(range(1, 60), generator.randint(1, 10)))
        limit = generator.randint(1, 6)
        best = generator.choice(steps + [None])
        best_path = None if best is None else f"/run/checkpoint-{best}"
        deleted = checkpoints_to_delete(_paths(steps), limit, best_path)
        kept = [path for _, path in _paths(steps) if path not in deleted]
        assert f"/run/checkpoint-{steps[-1]}" in kept
        if best_path is not None:
            assert best_path in kept
        protected = 1 + (best is not None and best != steps[-1])
        assert len(kept) == (len(steps) if len(steps) <= limit else max(limit, protected))


def test_rotation_matches_the_reference_function(tmp_path):
    from transformers.trainer_utils import rotate_checkpoints as reference_rotate

    generator = random.Random(1)
    for case in range(30):
        steps = sorted(generator.sample(range(1, 40), generator.randint(1, 7)))
        limit = generator.choice([None, 0, 1, 2, 3, 5])
        best = generator.choice(steps + [None])
        folders = {}
        for side in ("reference", "ours"):
            run_dir = tmp_path / f"{case}-{side}"
            for step in steps:
                (run_dir / f"checkpoint-{step}").mkdir(parents=True)
            folders[side] = run_dir
        best_of = {
            side: None if best is None else str(folders[side] / f"checkpoint-{best}") for side in folders
        }
        reference_rotate(str(folders["reference"]), limit, best_of["reference"], use_mtime=False)
        checkpoint_files.rotate_checkpoints(
            str(folders["ours"]), limit, best_of["ours"], newest=None, token="t"
        )
        assert checkpoint_steps(folders["ours"]) == checkpoint_steps(folders["reference"]), (
            steps,
            limit,
            best,
        )
        assert listing(folders["ours"]) == listing(folders["reference"])


def test_just_written_checkpoint_is_newest_like_reference_mtime(tmp_path):
    from transformers.trainer_utils import rotate_checkpoints as reference_rotate

    for side in ("reference", "ours"):
        run_dir = tmp_path / side
        for step in (500, 1000, 100):
            (run_dir / f"checkpoint-{step}").mkdir(parents=True)
        # Leftovers of an earlier run are older than the folder just written.
        os.utime(run_dir / "checkpoint-500", (1_000_000, 1_000_000))
        os.utime(run_dir / "checkpoint-1000", (1_000_010, 1_000_010))
    reference_rotate(str(tmp_path / "reference"), 1, None, use_mtime=True)
    newest = str(tmp_path / "ours" / "checkpoint-100")
    checkpoint_files.rotate_checkpoints(str(tmp_path / "ours"), 1, None, newest=newest, token="t")
    assert checkpoint_steps(tmp_path / "ours") == checkpoint_steps(tmp_path / "reference") == [100]


def test_rotation_leaves_folders_that_are_not_step_checkpoints(tmp_path):
    """Divergence pin: the reference's mtime order takes every `checkpoint-*` folder, a user's too."""
    from transformers.trainer_utils import rotate_checkpoints as reference_rotate

    for side in ("reference", "ours"):
        for name in ("checkpoint-best", "checkpoint-4", "checkpoint-6"):
            (tmp_path / side / name).mkdir(parents=True)
        os.utime(tmp_path / side / "checkpoint-best", (1_000_000, 1_000_000))
    reference_rotate(str(tmp_path / "reference"), 2, None, use_mtime=True)
    assert listing(tmp_path / "reference") == ["checkpoint-4", "checkpoint-6"]
    checkpoint_files.rotate_checkpoints(str(tmp_path / "ours"), 2, None, newest=None, token="t")
    assert listing(tmp_path / "ours") == ["checkpoint-4", "checkpoint-6", "checkpoint-best"]


# CKPT-3.9 (measured on the reference): eval + save every step, 6 steps, best at step 2.
SPEC_ROTATION_ROWS = [
    ("limit 2", 2, [[1], [1, 2], [2, 3], [2, 4], [2, 5], [2, 6]], [2, 6]),
    ("limit 1", 1, [[1], [2], [2, 3], [2, 4], [2, 5], [2, 6]], [2]),
    ("limit 3", 3, [[1], [1, 2], [1, 2, 3], [2, 3, 4], [2, 4, 5], [2, 5, 6]], [2, 5, 6]),
]


@pytest.mark.parametrize(
    "limit, after_each, final", [r[1:] for r in SPEC_ROTATION_ROWS], ids=[r[0] for r in SPEC_ROTATION_ROWS]
)
def test_spec_rotation_sequences_on_disk(tmp_path, limit, after_each, final):
    # The best metric is tracked from step 1 on: [0.5, 0.9, 0.6, 0.7, 0.4, 0.3] with greater_is_better.
    args = reference_args(
        tmp_path, save_total_limit=limit, metric_for_best_model="score", eval_strategy="steps"
    )
    trainer = StandIn(args)
    seen = []
    for step, score in enumerate([0.5, 0.9, 0.6, 0.7, 0.4, 0.3], start=1):
        trainer.state.global_step = step
        trainer._determine_best_metric({"eval_score": score}, None)
        trainer._save_checkpoint(trainer.model, None)
        seen.append(checkpoint_steps(tmp_path))
    assert seen == after_each
    assert trainer.state.best_model_checkpoint == os.path.join(str(tmp_path), "checkpoint-2")
    trainer._checkpointer.rotate_at_train_end(None)
    assert checkpoint_steps(tmp_path) == final
    assert all(is_complete_checkpoint(path) for _, path in checkpoint_files.list_checkpoints(str(tmp_path)))


def test_train_end_cleanup_rule():
    checkpoints = _paths([2, 5, 6])
    assert checkpoints_to_delete_at_train_end(checkpoints, 1, "/run/checkpoint-2") == [
        "/run/checkpoint-5",
        "/run/checkpoint-6",
    ]
    assert checkpoints_to_delete_at_train_end(checkpoints, 2, "/run/checkpoint-2") == []
    assert checkpoints_to_delete_at_train_end(checkpoints, 1, None) == []
    # The best folder is gone: nothing is deleted (the reference raises FileNotFoundError in os.path.samefile).
    assert checkpoints_to_delete_at_train_end(checkpoints, 1, "/run/checkpoint-3") == []


# ---- contents and parity with a reference-written checkpoint --------------------------------------------------


def test_reference_folder_listing_is_the_spec_one(reference_run):
    for step in (1, 2):
        assert listing(reference_run.output_dir / f"checkpoint-{step}") == REFERENCE_FILES_PLAIN


def _standin_like_reference(reference_run, output_dir):
    """Our mixin over the reference trainer's own model / optimizer / scheduler, state from its checkpoint-2."""
    ref = reference_run.trainer
    args = reference_args(output_dir, save_steps=1, max_steps=2, hub_token="secret")
    trainer = StandIn(args, ref.model, optimizer=ref.optimizer, lr_scheduler=ref.lr_scheduler)
    trainer.state = TrainerState.load_from_json(
        str(reference_run.output_dir / "checkpoint-2" / "trainer_state.json")
    )
    trainer.control = TrainerControl(**trainer.state.stateful_callbacks["TrainerControl"]["args"])
    return trainer


def test_checkpoint_contents_equal_the_reference(reference_run, tmp_path):
    trainer = _standin_like_reference(reference_run, tmp_path)
    python_state = random.getstate()
    trainer._save_checkpoint(trainer.model, None)
    ours = tmp_path / "checkpoint-2"
    theirs = reference_run.output_dir / "checkpoint-2"
    assert listing(ours) == sorted(REFERENCE_FILES_PLAIN + [COMPLETE_MARKER_NAME])
    assert trainer.store_flos_calls == 1

    ours_weights = safetensors.torch.load_file(str(ours / "model.safetensors"))
    theirs_weights = safetensors.torch.load_file(str(theirs / "model.safetensors"))
    assert ours_weights.keys() == theirs_weights.keys()
    assert all(torch.equal(ours_weights[key], theirs_weights[key]) for key in ours_weights)
    from safetensors import safe_open

    with safe_open(str(ours / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}

    for name in ("optimizer.pt", "scheduler.pt"):
        mine = torch.load(ours / name, weights_only=True)
        reference = torch.load(theirs / name, weights_only=True)
        assert _nested_equal(mine, reference), name
    assert (ours / "trainer_state.json").read_bytes() == (theirs / "trainer_state.json").read_bytes()

    with numpy_safe_globals():
        mine = torch.load(ours / "rng_state.pth", weights_only=True)
        reference = torch.load(theirs / "rng_state.pth", weights_only=True)
    assert mine.keys() == reference.keys()
    assert mine["python"] == python_state


def _nested_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_nested_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_nested_equal(x, y) for x, y in zip(a, b))
    return a == b


def test_training_args_bin_is_plain_and_token_free(reference_run, tmp_path):
    trainer = _standin_like_reference(reference_run, tmp_path)
    trainer._save_checkpoint(trainer.model, None)
    folder = tmp_path / "checkpoint-2"
    for name in os.listdir(folder):
        assert b"secret" not in (folder / name).read_bytes(), name
    loaded = torch.load(folder / "training_args.bin", weights_only=True)
    assert loaded == trainer.args.to_dict()
    assert loaded["hub_token"] == "<HUB_TOKEN>"
    # The divergence this pins: the reference pickles its arguments, token included, and needs unpickling.
    reference_bin = reference_run.output_dir / "checkpoint-2" / "training_args.bin"
    assert b"secret" in reference_bin.read_bytes()
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(reference_bin, weights_only=True)


def test_training_args_redacted_even_when_to_dict_leaks():
    class LeakyArgs:
        def to_dict(self):
            return {"hub_token": "secret", "my_token": "secret2", "nested": {"a": (1, 2)}, "path": "x"}

    plain = training_args_to_plain_dict(LeakyArgs())
    assert plain == {
        "hub_token": "<HUB_TOKEN>",
        "my_token": "<MY_TOKEN>",
        "nested": {"a": (1, 2)},
        "path": "x",
    }
    buffer = io.BytesIO()
    torch.save(plain, buffer)
    assert b"secret" not in buffer.getvalue()


def test_best_model_checkpoint_names_the_folder_being_written(tmp_path):
    args = reference_args(tmp_path, metric_for_best_model="loss", eval_strategy="steps")
    trainer = StandIn(args)
    trainer.state.global_step = 3
    trainer._determine_best_metric({"eval_loss": 0.1}, None)
    trainer._save_checkpoint(trainer.model, None)
    expected = os.path.join(str(tmp_path), "checkpoint-3")
    assert trainer.state.best_model_checkpoint == expected
    with open(os.path.join(expected, "trainer_state.json")) as f:
        assert json.load(f)["best_model_checkpoint"] == expected


def test_save_only_model_listing(tmp_path):
    trainer = StandIn(reference_args(tmp_path, save_only_model=True))
    trainer.save_at(4)
    assert listing(tmp_path / "checkpoint-4") == [
        COMPLETE_MARKER_NAME,
        "model.safetensors",
        "trainer_state.json",
        "training_args.bin",
    ]


def test_scaler_saved_when_lightning_holds_one(tmp_path):
    trainer = StandIn(reference_args(tmp_path))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    trainer.lightning_trainer = SimpleNamespace(precision_plugin=SimpleNamespace(scaler=scaler))
    trainer.save_at(1)
    assert "scaler.pt" in listing(tmp_path / "checkpoint-1")
    assert torch.load(tmp_path / "checkpoint-1" / "scaler.pt", weights_only=True) == scaler.state_dict()


def test_stateful_callbacks_refreshed_not_appended(reference_run, tmp_path):
    """Divergence pin: several instances of one exportable class are stored once each, with current states."""
    with open(reference_run.output_dir / "checkpoint-2" / "trainer_state.json") as f:
        reference_entry = json.load(f)["stateful_callbacks"]["ReferenceCounting"]
    # The reference appends to the list at each save: 2 initial + 2 per save, twice.
    assert len(reference_entry) == 6
    callbacks = [CountingCallback(), CountingCallback()]
    trainer = StandIn(reference_args(tmp_path), callbacks=callbacks)
    trainer.state = TrainerState(stateful_callbacks=callbacks + [trainer.control])
    for step in (1, 2):
        for callback in callbacks:
            callback.on_step_end(None, None, None)
        trainer.save_at(step)
    with open(tmp_path / "checkpoint-2" / "trainer_state.json") as f:
        ours = json.load(f)["stateful_callbacks"]
    assert ours["CountingCallback"] == [{"args": {"start": 0}, "attributes": {"count": 2}}] * 2
    assert ours["TrainerControl"] == trainer.control.state()


# ---- save_model / save_state / load best model ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    from transformers import BertTokenizer

    folder = tmp_path_factory.mktemp("vocab")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(45)]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return BertTokenizer(vocab_file=str(folder / "vocab.txt"))


@pytest.mark.parametrize("with_tokenizer", [True, False])
def test_save_model_matches_reference(tmp_path, tiny_tokenizer, with_tokenizer):
    import transformers

    processing_class = tiny_tokenizer if with_tokenizer else None
    model = make_tiny_bert_classifier()
    reference = transformers.Trainer(
        model=copy.deepcopy(model),
        args=reference_args(tmp_path / "reference"),
        processing_class=processing_class,
    )
    reference.save_model()
    ours = StandIn(reference_args(tmp_path / "ours"), copy.deepcopy(model), processing_class=processing_class)
    ours.save_model()
    assert listing(tmp_path / "ours") == listing(tmp_path / "reference")
    expected = ["config.json", "model.safetensors", "training_args.bin"]
    if with_tokenizer:
        expected += ["tokenizer.json", "tokenizer_config.json"]
    assert listing(tmp_path / "ours") == sorted(expected)
    for name in (
        ("config.json", "tokenizer.json", "tokenizer_config.json") if with_tokenizer else ("config.json",)
    ):
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "reference" / name).read_bytes()
    mine = safetensors.torch.load_file(str(tmp_path / "ours" / "model.safetensors"))
    theirs = safetensors.torch.load_file(str(tmp_path / "reference" / "model.safetensors"))
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_save_model_plain_module(tmp_path):
    StandIn(reference_args(tmp_path)).save_model()
    assert listing(tmp_path) == ["model.safetensors", "training_args.bin"]


def test_save_state_writes_the_state(tmp_path):
    trainer = StandIn(reference_args(tmp_path))
    trainer.state.global_step = 7
    trainer.state.log_history.append({"loss": 0.5, "step": 7})
    trainer.save_state()
    assert listing(tmp_path) == ["trainer_state.json"]
    assert TrainerState.load_from_json(str(tmp_path / "trainer_state.json")) == trainer.state


@pytest.mark.parametrize("model_kind", ["plain", "pretrained"])
def test_load_best_model_restores_the_best_weights(tmp_path, model_kind):
    model = make_regression_mlp() if model_kind == "plain" else make_tiny_bert_classifier()
    args = reference_args(tmp_path, metric_for_best_model="loss", eval_strategy="steps")
    trainer = StandIn(args, model)
    trainer.state.global_step = 2
    trainer._determine_best_metric({"eval_loss": 0.1}, None)
    trainer._save_checkpoint(trainer.model, None)
    saved = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with torch.no_grad():
        for parameter in trainer.model.parameters():
            parameter.add_(1.0)
    trainer._load_best_model()
    current = trainer.model.state_dict()
    assert current.keys() == saved.keys()
    assert all(torch.equal(current[key], saved[key]) for key in saved)


def test_load_best_model_reads_sharded_safetensors(tmp_path):
    model = make_tiny_bert_classifier()
    folder = tmp_path / "checkpoint-1"
    model.save_pretrained(str(folder), max_shard_size="4KB")
    assert "model.safetensors.index.json" in listing(folder)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = StandIn(reference_args(tmp_path), model)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(0.0)
    trainer.state.best_model_checkpoint = str(folder)
    trainer._load_best_model()
    assert all(torch.equal(model.state_dict()[key], saved[key]) for key in saved)


def test_load_best_model_warns_like_the_reference(tmp_path, caplog):
    trainer = StandIn(reference_args(tmp_path))
    trainer.state.best_model_checkpoint = str(tmp_path / "checkpoint-9")
    with caplog.at_level(logging.WARNING, logger="hf_lightning.trainer.checkpoint_methods"):
        trainer._load_best_model()
    assert (
        f"Could not locate the best model at {tmp_path / 'checkpoint-9' / 'pytorch_model.bin'}" in caplog.text
    )


def test_load_best_model_reports_missing_and_unexpected_keys(tmp_path, caplog):
    trainer = StandIn(reference_args(tmp_path))
    folder = tmp_path / "checkpoint-1"
    folder.mkdir()
    weights = dict(trainer.model.state_dict())
    weights.pop("norm.bias")
    weights["extra"] = torch.zeros(1)
    safetensors.torch.save_file(weights, str(folder / "model.safetensors"))
    trainer.state.best_model_checkpoint = str(folder)
    with caplog.at_level(logging.WARNING, logger="hf_lightning.trainer.checkpoint_methods"):
        trainer._load_best_model()
    assert "There were missing keys in the checkpoint model loaded: ['norm.bias']." in caplog.text
    assert "There were unexpected keys in the checkpoint model loaded: ['extra']." in caplog.text


# ---- best metric ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "metric, greater, values, save_strategy",
    [
        ("score", True, [0.5, 0.9, 0.6, 0.7, 0.4, 0.3], "steps"),
        ("eval_loss", False, [0.5, 0.9, 0.6, 0.4, 0.4, 0.45], "steps"),
        ("loss", None, [0.5, 0.3, 0.3, 0.7], "epoch"),
        ("score", True, [0.1, 0.2], "no"),
        ("accuracy", None, [0.1, 0.7, 0.2], "best"),
    ],
)
def test_determine_best_metric_matches_reference(tmp_path, metric, greater, values, save_strategy):
    import transformers

    name = metric if metric.startswith("eval_") else f"eval_{metric}"
    kwargs = {"metric_for_best_model": metric, "greater_is_better": greater, "save_strategy": save_strategy}
    kwargs["eval_strategy"] = "steps" if save_strategy == "best" else save_strategy
    args = reference_args(tmp_path, **kwargs)
    reference = SimpleNamespace(args=args, state=transformers.TrainerState())
    ours = StandIn(args)
    for step, value in enumerate(values, start=1):
        reference.state.global_step = ours.state.global_step = step
        metrics = {name: value, "epoch": 1.0}
        expected = transformers.Trainer._determine_best_metric(reference, metrics, None)
        assert ours._determine_best_metric(metrics, None) == expected
        assert (ours.state.best_metric, ours.state.best_global_step) == (
            reference.state.best_metric,
            reference.state.best_global_step,
        )


def test_missing_best_metric_key_error_matches_reference(tmp_path):
    import transformers

    args = reference_args(tmp_path, metric_for_best_model="foo", eval_strategy="steps")
    metrics = {"eval_loss": 0.3, "eval_score": 0.5, "eval_runtime": 0.1, "epoch": 1.0}
    reference = SimpleNamespace(args=args, state=transformers.TrainerState())
    with pytest.raises(KeyError) as expected:
        transformers.Trainer._determine_best_metric(reference, metrics, None)
    with pytest.raises(KeyError) as ours:
        StandIn(args)._determine_best_metric(metrics, None)
    assert str(ours.value) == str(expected.value)
    assert "['eval_loss', 'eval_score', 'eval_runtime', 'epoch']" in str(ours.value)


# ---- completeness and get_last_checkpoint -----------------------------------------------------------------------


def test_reference_written_folders_are_complete(reference_run):
    for step in (1, 2):
        assert is_complete_checkpoint(str(reference_run.output_dir / f"checkpoint-{step}"))
    assert get_last_checkpoint(str(reference_run.output_dir)) == str(
        reference_run.output_dir / "checkpoint-2"
    )


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    "damage",
    [
        lambda folder: _truncate(folder / "model.safetensors"),
        lambda folder: _truncate(folder / "optimizer.pt"),
        lambda folder: (folder / "scheduler.pt").unlink(),
        lambda folder: _truncate(folder / "rng_state.pth"),
        lambda folder: (folder / "trainer_state.json").write_text('{"global_step": '),
    ],
    ids=["weights truncated", "optimizer truncated", "scheduler missing", "rng truncated", "state cut"],
)
def test_damaged_reference_folder_is_incomplete(reference_run, tmp_path, damage):
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run.output_dir, run_dir)
    damage(run_dir / "checkpoint-2")
    assert not is_complete_checkpoint(str(run_dir / "checkpoint-2"))
    assert get_last_checkpoint(str(run_dir)) == str(run_dir / "checkpoint-1")


def test_get_last_checkpoint_skips_incomplete_and_scratch(tmp_path):
    trainer = StandIn(reference_args(tmp_path))
    trainer.save_at(1)
    trainer.save_at(2)
    assert get_last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-2")
    (tmp_path / "checkpoint-2" / COMPLETE_MARKER_NAME).write_text("{")
    shutil.copytree(tmp_path / "checkpoint-1", tmp_path / ".checkpoint-5.tmp-123")
    shutil.copytree(tmp_path / "checkpoint-1", tmp_path / "checkpoint-100x")
    (tmp_path / "checkpoint-50").write_text("a file, not a folder")
    (tmp_path / "checkpoint-3").mkdir()
    shutil.copy(tmp_path / "checkpoint-1" / "model.safetensors", tmp_path / "checkpoint-3")
    assert not is_complete_checkpoint(str(tmp_path / "checkpoint-2"))
    assert not is_complete_checkpoint(str(tmp_path / "checkpoint-3"))
    assert get_last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-1")
    assert get_last_checkpoint(str(tmp_path / "checkpoint-3")) is None


# ---- atomicity ------------------------------------------------------------------------------------------------


def _prepared_trainer(run_dir, replace: bool, **arguments):
    """checkpoint-1 exists; with `replace`, a first version of checkpoint-2 exists too (epoch 0.5)."""
    trainer = StandIn(
        reference_args(run_dir, **arguments), processing_class=_RecordingProcessor(), callbacks=[CountingCallback()]
    )
    trainer.save_at(1)
    if replace:
        trainer.state.epoch = 0.5
        trainer.save_at(2)
    trainer.state.epoch = 1.0
    trainer.state.global_step = 2
    return trainer


class _RecordingProcessor:
    def save_pretrained(self, output_dir):
        with open(os.path.join(output_dir, "processor.json"), "w") as f:
            f.write("{}")


def _epoch_of(folder) -> float:
    with open(os.path.join(folder, "trainer_state.json")) as f:
        return json.load(f)["epoch"]


def test_every_save_point_is_reached_in_order(tmp_path):
    trainer = _prepared_trainer(tmp_path, replace=True, save_total_limit=1)
    reached = []
    with fault_hook(reached.append):
        trainer._save_checkpoint(trainer.model, None)
    assert reached == list(SAVE_POINTS)
    assert checkpoint_steps(tmp_path) == [2]


class _InjectedFailure(Exception):
    pass


# Every save point, for a save of a new step and for a second save of the same step (which replaces a folder);
# the points that move the existing folder aside are only reached in the second case.
FAULT_CASES = [
    pytest.param(point, replace, id=f"{point}-{'same step again' if replace else 'new step'}")
    for replace in (False, True)
    for point in SAVE_POINTS
    if replace or point not in ("rename_aside", "delete_aside")
]


@pytest.mark.parametrize("point, replace", FAULT_CASES)
def test_failure_at_any_point_leaves_only_complete_checkpoints(tmp_path, point, replace):
    trainer = _prepared_trainer(tmp_path, replace)

    def fail(reached_point):
        if reached_point == point:
            raise _InjectedFailure(point)

    with fault_hook(fail), pytest.raises(_InjectedFailure):
        trainer._save_checkpoint(trainer.model, None)
    committed = SAVE_POINTS.index(point) > SAVE_POINTS.index("rename")
    _assert_consistent(tmp_path, replace, committed)
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]


def _assert_consistent(run_dir, replace: bool, committed: bool) -> None:
    checkpoints = checkpoint_files.list_checkpoints(str(run_dir))
    assert all(is_complete_checkpoint(path) for _, path in checkpoints)
    assert _epoch_of(run_dir / "checkpoint-1") == 0
    if committed:
        assert [step for step, _ in checkpoints] == [1, 2]
        assert _epoch_of(run_dir / "checkpoint-2") == 1.0
    elif replace:
        assert [step for step, _ in checkpoints] == [1, 2]
        assert _epoch_of(run_dir / "checkpoint-2") == 0.5
    else:
        assert [step for step, _ in checkpoints] == [1]


KILLED = 86


@pytest.mark.parametrize("point, replace", FAULT_CASES)
def test_kill_at_any_point_then_next_save_recovers(tmp_path, point, replace):
    """A process killed at `point` (os._exit in a forked child, no cleanup runs) never leaves a bad checkpoint."""
    trainer = _prepared_trainer(tmp_path, replace)
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        exit_code = 0
        try:
            with fault_hook(lambda reached: os._exit(KILLED) if reached == point else None):
                trainer._save_checkpoint(trainer.model, None)
        except BaseException:
            exit_code = 1
        os._exit(exit_code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == KILLED
    committed = SAVE_POINTS.index(point) > SAVE_POINTS.index("rename")
    in_aside_window = replace and point == "rename"
    checkpoints = checkpoint_files.list_checkpoints(str(tmp_path))
    assert all(is_complete_checkpoint(path) for _, path in checkpoints)
    expected_last = 2 if committed or (replace and not in_aside_window) else 1
    assert get_last_checkpoint(str(tmp_path)) == str(tmp_path / f"checkpoint-{expected_last}")

    # The next save of a fresh process tidies the killed save's scratch (restoring an aside folder).
    trainer.save_at(3)
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]
    _assert_consistent_after_recovery(tmp_path, replace, committed)


def _assert_consistent_after_recovery(run_dir, replace: bool, committed: bool) -> None:
    checkpoints = checkpoint_files.list_checkpoints(str(run_dir))
    assert all(is_complete_checkpoint(path) for _, path in checkpoints)
    assert [step for step, _ in checkpoints] == ([1, 2, 3] if committed or replace else [1, 3])
    if committed:
        assert _epoch_of(run_dir / "checkpoint-2") == 1.0
    elif replace:
        assert _epoch_of(run_dir / "checkpoint-2") == 0.5


# ---- metric output helpers --------------------------------------------------------------------------------------


METRICS = {
    "train_runtime": 3725.1234,
    "eval_runtime": 0.0104,
    "train_mem_cpu_alloc_delta": 5 * 2**20 + 7,
    "total_flos": 3 * 2**30 + 5,
    "train_loss": 0.123456789,
    "epoch": 1.5,
    "train_samples": 12,
    "note": "text",
}


def test_metrics_format_matches_reference():
    from transformers.trainer_pt_utils import metrics_format as reference_format

    formatted = CheckpointMixin.metrics_format(METRICS)
    assert formatted == reference_format(METRICS)
    assert formatted["train_runtime"] == "1:02:05.12"
    assert formatted["eval_runtime"] == "0:00:00.01"
    assert formatted["train_mem_cpu_alloc_delta"] == "5MB"
    assert formatted["total_flos"] == "3GF"
    assert formatted["train_loss"] == 0.1235
    assert StandIn(SimpleNamespace()).metrics_format(METRICS) == formatted


def test_metrics_format_on_an_instance_diverges_from_reference():
    """Divergence pin: the reference binds its plain function, so the instance call raises TypeError."""
    import transformers

    instance = object.__new__(transformers.Trainer)
    with pytest.raises(TypeError, match="takes 1 positional argument but 2 were given"):
        instance.metrics_format(METRICS)
    assert StandIn(SimpleNamespace()).metrics_format(METRICS) == CheckpointMixin.metrics_format(METRICS)


def test_log_metrics_prints_like_reference(capsys):
    from transformers.trainer_pt_utils import log_metrics as reference_log_metrics

    reference_log_metrics(SimpleNamespace(is_world_process_zero=lambda: True), "train", METRICS)
    expected = capsys.readouterr().out
    StandIn(SimpleNamespace()).log_metrics("train", METRICS)
    assert capsys.readouterr().out == expected
    assert expected.startswith("***** train metrics *****\n  epoch ")


def test_save_metrics_files_equal_reference(tmp_path):
    from transformers.trainer_pt_utils import save_metrics as reference_save_metrics

    sides = {}
    for side in ("reference", "ours"):
        folder = tmp_path / side
        folder.mkdir()
        sides[side] = SimpleNamespace(
            args=SimpleNamespace(output_dir=str(folder)), is_world_process_zero=lambda: True
        )
    ours = StandIn(sides["ours"].args)
    calls = [
        ("train", {"train_loss": 0.5, "epoch": 1.0}),
        ("eval", {"eval_loss": 0.25}),
        ("test", {"test_loss": 1.0}),
    ]
    for split, metrics in calls:
        combined = split != "test"
        reference_save_metrics(sides["reference"], split, metrics, combined=combined)
        ours.save_metrics(split, metrics, combined=combined)
    names = listing(tmp_path / "reference")
    assert names == ["all_results.json", "eval_results.json", "test_results.json", "train_results.json"]
    assert listing(tmp_path / "ours") == names
    for name in names:
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "reference" / name).read_bytes()
    assert json.loads((tmp_path / "ours" / "all_results.json").read_text()) == {
        "train_loss": 0.5,
        "epoch": 1.0,
        "eval_loss": 0.25,
    }


def test_numpy_rng_state_roundtrip(tmp_path):
    """Our rng_state.pth restores every generator it names (what resume will rely on)."""
    trainer = StandIn(reference_args(tmp_path))
    np.random.seed(3)
    trainer.save_at(1)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    with numpy_safe_globals():
        states = torch.load(tmp_path / "checkpoint-1" / "rng_state.pth", weights_only=True)
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["cpu"])
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


# ---- end to end through the facade ------------------------------------------------------------------------------


def _listing_callback(base):
    class ListRunDirOnSave(base):
        def __init__(self):
            self.seen = []

        def on_save(self, args, state, control, **kwargs):
            self.seen.append(sorted(os.listdir(args.output_dir)))

    return ListRunDirOnSave()


def test_facade_run_writes_the_reference_folders(tmp_path, monkeypatch):
    """save_steps=2, save_total_limit=2, 7 steps: same folders after each save, same files, same trainer state."""
    import transformers

    from hf_lightning import TrainingArguments
    from hf_lightning.callbacks import TrainerCallback as OurCallback
    from hf_lightning.trainer.trainer import HFLightningTrainer
    settings = dict(
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        save_steps=2,
        save_total_limit=2,
        max_steps=7,
        per_device_train_batch_size=2,
        logging_steps=2,
    )
    sides, trainer_args = {}, {}
    for name, trainer_cls, args_cls, callback_base in (
        ("reference", transformers.Trainer, transformers.TrainingArguments, transformers.TrainerCallback),
        ("ours", HFLightningTrainer, TrainingArguments, OurCallback),
    ):
        callback = _listing_callback(callback_base)
        trainer = trainer_cls(
            model=make_regression_mlp(),
            args=args_cls(output_dir=str(tmp_path / name), **settings),
            train_dataset=regression_data(10),
            callbacks=[callback],
        )
        trainer.train()
        sides[name], trainer_args[name] = callback.seen, trainer.args
    assert sides["ours"] == sides["reference"]
    assert sides["ours"][-1] == ["checkpoint-6", "checkpoint-7"]
    for folder in ("checkpoint-6", "checkpoint-7"):
        ours, reference = tmp_path / "ours" / folder, tmp_path / "reference" / folder
        assert listing(ours) == sorted(listing(reference) + [COMPLETE_MARKER_NAME])
        assert is_complete_checkpoint(str(ours))
        stored_args = torch.load(ours / "training_args.bin", weights_only=True)
        assert stored_args == trainer_args["ours"].to_dict()
        assert _comparable_state(ours) == pytest.approx(_comparable_state(reference))


def _comparable_state(folder) -> dict:
    with open(folder / "trainer_state.json") as f:
        state = json.load(f)
    state["log_history"] = [
        {k: v for k, v in entry.items() if not k.endswith(("_runtime", "_per_second"))}
        for entry in state["log_history"]
    ]
    return _flatten(state)


def _flatten(value, prefix="") -> dict:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flatten(item, f"{prefix}{key}.").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in _flatten(item, f"{prefix}{i}.").items()}
    return {prefix: value}
