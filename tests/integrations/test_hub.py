"""Hub pushes side by side with transformers.Trainer, against the Hub-compatible server of `hub_server.py`.

Each scenario trains the reference and hf_lightning on the same tiny model, data and seed, pushing to two repos of
the same server; the commit sequences (messages, files added and deleted) and the final trees must be equal.
`WaitForPushes` makes every save's push happen, `HoldCommitsDuringTraining` makes every later save find a push
still running. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

import hf_lightning
from tests.integrations.hub_server import (
    OTHER_TOKEN,
    TOKEN,
    USER,
    HoldCommitsDuringTraining,
    WaitForPushes,
    point_hub_at,
    shared_server,
)
from tests.models import classification_data, make_tiny_bert_classifier

ROOT = Path(__file__).resolve().parents[2]
SIDES = ("ref", "ours")
COMMON = dict(
    use_cpu=True, report_to="none", disable_tqdm=True, per_device_train_batch_size=2, max_steps=4,
    save_strategy="steps", save_steps=2, logging_steps=1, learning_rate=1e-3, push_to_hub=True,
)
# Each scenario: the hub fields, and how the script's final push_to_hub() is called.
SCENARIOS = {
    "every_save": {"hub_strategy": "every_save", "hub_revision": "dev"},
    "end": {"hub_strategy": "end"},
    "checkpoint": {"hub_strategy": "checkpoint", "hub_token": TOKEN},
    "all_checkpoints": {"hub_strategy": "all_checkpoints", "hub_private_repo": True},
}


def _module(side: str):
    if side == "ref":
        import transformers

        return transformers
    return hf_lightning


def _repo(scenario: str, side: str) -> str:
    return f"{USER}/{scenario}-{side}"


@pytest.fixture(scope="module")
def hub():
    server = shared_server()
    server.state.reset()
    with pytest.MonkeyPatch.context() as mp:
        point_hub_at(server, mp)
        yield server


def _train(side: str, out_dir: Path, callbacks: list, **fields):
    module = _module(side)
    args = module.TrainingArguments(output_dir=str(out_dir), **{**COMMON, **fields})
    trainer = module.Trainer(
        model=make_tiny_bert_classifier(), args=args, train_dataset=classification_data(12), callbacks=callbacks
    )
    for callback in callbacks:
        callback.trainer = trainer
    trainer.train()
    return trainer


@pytest.fixture(scope="module")
def scenario_runs(hub, tmp_path_factory):
    """scenario -> side -> (trainer, output_dir, what the final push_to_hub returned)."""
    from huggingface_hub import HfApi

    runs: dict[str, dict] = {}
    for scenario, fields in SCENARIOS.items():
        runs[scenario] = {}
        for side in SIDES:
            repo_id = _repo(scenario, side)
            if "hub_revision" in fields:  # the branch exists beforehand (neither trainer creates it)
                HfApi().create_repo(repo_id)
                HfApi().create_branch(repo_id, branch=fields["hub_revision"])
            out_dir = tmp_path_factory.mktemp(f"{scenario}-{side}")
            trainer = _train(side, out_dir, [WaitForPushes()], hub_model_id=repo_id, **fields)
            if scenario == "end":
                future = trainer.push_to_hub(blocking=False)
                pushed = future.result()
            elif scenario == "checkpoint":  # keywords go to the model card
                pushed = trainer.push_to_hub(license="mit", tags=["hub-test"], finetuned_from="tiny-bert")
            else:
                pushed = trainer.push_to_hub()
            runs[scenario][side] = (trainer, out_dir, pushed)
    return runs


def _sequence(hub, repo_id: str) -> list[tuple]:
    return [(c.branch, c.message, sorted(c.added), sorted(c.deleted)) for c in hub.state.commits_of(repo_id)]


def _weights(content: bytes) -> dict[str, torch.Tensor]:
    return safetensors.torch.load(content)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_commit_sequence_and_tree_match_the_reference(hub, scenario_runs, scenario):
    fields = SCENARIOS[scenario]
    branch = fields.get("hub_revision", "main")
    reference, ours = (_sequence(hub, _repo(scenario, side)) for side in SIDES)
    assert ours == reference
    strategy = fields["hub_strategy"]
    messages = [message for _, message, _, _ in ours]
    trained = {
        "every_save": ["Training in progress, step 2", "Training in progress, step 4"],
        "end": [],
        "checkpoint": [f"Training in progress, step {s}{c}" for s in (2, 4) for c in ("", ", checkpoint")],
        "all_checkpoints": [f"Training in progress, step {s}{c}" for s in (2, 4) for c in ("", ", checkpoint")],
    }[strategy]
    assert messages == trained + ["End of training"]
    assert {commit_branch for commit_branch, *_ in ours} == {branch}
    reference_tree, our_tree = (hub.state.tree(_repo(scenario, side), branch) for side in SIDES)
    assert sorted(our_tree) == sorted(reference_tree)
    assert not any("hf_lightning_complete" in path or path.startswith(".checkpoint-") for path in our_tree)
    assert {"config.json", "model.safetensors", "README.md", "training_args.bin"} <= set(our_tree)
    folder = {"checkpoint": "last-checkpoint/", "all_checkpoints": "checkpoint-2/"}.get(strategy)
    if folder is not None:
        assert f"{folder}optimizer.pt" in our_tree and f"{folder}trainer_state.json" in our_tree
    our_weights, reference_weights = _weights(our_tree["model.safetensors"]), _weights(reference_tree["model.safetensors"])
    for key, value in reference_weights.items():
        torch.testing.assert_close(our_weights[key], value, rtol=1e-5, atol=1e-6)
    # The model card is the reference's, but for the repo name.
    names = {side: _repo(scenario, side).split("/")[1] for side in SIDES}
    assert our_tree["README.md"].decode().replace(names["ours"], "NAME") == reference_tree["README.md"].decode().replace(
        names["ref"], "NAME"
    )
    if scenario == "checkpoint":
        card = our_tree["README.md"].decode()
        assert "license: mit" in card and "- hub-test" in card and "tiny-bert" in card
    if "hub_revision" in fields:  # main holds the initial commit only
        assert sorted(hub.state.tree(_repo(scenario, "ours"))) == [".gitattributes"]


def test_private_repo_and_push_results(hub, scenario_runs):
    for side in SIDES:
        assert hub.state.repos[_repo("all_checkpoints", side)].private is True
        assert hub.state.repos[_repo("checkpoint", side)].private is False
        trainer, _, pushed = scenario_runs["end"][side]
        assert trainer.hub_model_id == _repo("end", side)
        # blocking=False returned a Future whose result is the commit of the final push.
        head = hub.state.repos[_repo("end", side)].branches["main"]
        assert pushed.oid == head


@pytest.mark.parametrize("always_push", [False, True])
def test_a_running_push_skips_later_ones_unless_hub_always_push(hub, tmp_path, always_push):
    sequences, pushes, push_begins = [], [], []
    for side in SIDES:
        repo_id = f"{USER}/always-{always_push}-{side}"
        hold = HoldCommitsDuringTraining(hub)
        _train(
            side, tmp_path / side, [hold], hub_model_id=repo_id, hub_always_push=always_push, save_steps=1, max_steps=3
        )
        push_begins.append(hold.push_begins)
        sequences.append(_sequence(hub, repo_id))
        # One preupload request per upload_folder that ran: the pushes started (not skipped).
        pushes.append(sum(path == f"/api/models/{repo_id}/preupload/main" for _, path in hub.state.requests))
    assert sequences[1] == sequences[0]
    assert pushes == push_begins == ([3, 3] if always_push else [1, 1])
    assert sequences[1][0][1] == "Training in progress, step 1"


def test_a_wrong_or_missing_token_fails_before_training(hub, tmp_path, monkeypatch):
    from huggingface_hub.errors import HfHubHTTPError

    fields = dict(hub_model_id=f"{USER}/wrong-token", hub_token="hf_wrong_token_value")
    commits_before = len(hub.state.commits)
    with pytest.raises(HfHubHTTPError):  # the reference: at create_repo, in its constructor
        _train("ref", tmp_path / "ref", [], **fields)
    with pytest.raises(ValueError, match="did not accept the token") as error:
        _train("ours", tmp_path / "ours", [], **fields)
    assert "hub_token" in str(error.value) and "hf_wrong_token_value" not in str(error.value)
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(ValueError, match="needs a Hub token"):
        _train("ours", tmp_path / "missing", [], **{**fields, "hub_token": None})
    assert len(hub.state.commits) == commits_before
    assert f"{USER}/wrong-token" not in hub.state.repos
    assert not (tmp_path / "ours").exists() or not any((tmp_path / "ours").glob("checkpoint-*"))


def test_hub_token_cached_login_and_default_repo_name(hub, tmp_path, monkeypatch):
    """hub_token picks the account, else HF_TOKEN, else the cached login; without hub_model_id the repo is named
    after output_dir."""
    import huggingface_hub.constants as constants

    def construct(name: str, **fields):
        args = hf_lightning.TrainingArguments(output_dir=str(tmp_path / name), push_to_hub=True, use_cpu=True,
                                              report_to="none", **fields)
        return hf_lightning.Trainer(model=make_tiny_bert_classifier(), args=args).hub_model_id

    assert construct("named-by-dir", hub_token=OTHER_TOKEN) == "other/named-by-dir"
    assert construct("from-env") == f"{USER}/from-env"  # HF_TOKEN
    monkeypatch.delenv("HF_TOKEN")
    token_file = tmp_path / "hf-home" / "token"
    token_file.parent.mkdir()
    token_file.write_text(OTHER_TOKEN)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(token_file))
    assert construct("from-login") == "other/from-login"  # the cached login (`hf auth login`)
    assert {"other/named-by-dir", f"{USER}/from-env", "other/from-login"} <= set(hub.state.repos)


def test_explain_honours_the_push_flags(tmp_path, capsys):
    import json

    import hf_lightning.cli.main as cli

    path = tmp_path / "args.json"
    path.write_text(json.dumps({"output_dir": str(tmp_path), "push_to_hub": True, "hub_model_id": "me/model",
                                "hub_strategy": "checkpoint"}))
    assert cli.main(["explain", str(path)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:] if line.strip()}
    assert "honoured" in lines["push_to_hub"] and "honoured" in lines["hub_strategy"]


def _download(repo_id: str, revision: str, target: Path) -> Path:
    from huggingface_hub import snapshot_download

    snapshot_download(repo_id, revision=revision, allow_patterns=["last-checkpoint/*"], local_dir=target)
    return target / "last-checkpoint"


def test_resume_from_a_last_checkpoint_downloaded_from_the_hub(hub, scenario_runs, tmp_path):
    """The step-2 `last-checkpoint` of either trainer's push resumes bit-exact to the uninterrupted run."""
    uninterrupted = scenario_runs["checkpoint"]["ours"][0].model.state_dict()
    for side in SIDES:
        repo_id = _repo("checkpoint", side)
        commit = next(
            c for c in hub.state.commits_of(repo_id) if c.message == "Training in progress, step 2, checkpoint"
        )
        out_dir = tmp_path / side
        checkpoint = _download(repo_id, commit.sha, out_dir)
        assert '"global_step": 2' in (checkpoint / "trainer_state.json").read_text()
        args = hf_lightning.TrainingArguments(output_dir=str(out_dir), **{**COMMON, "push_to_hub": False})
        trainer = hf_lightning.Trainer(model=make_tiny_bert_classifier(seed=1), args=args,
                                       train_dataset=classification_data(12))
        trainer.train(resume_from_checkpoint=str(out_dir / "last-checkpoint"))
        assert trainer.state.global_step == 4
        for key, value in uninterrupted.items():
            assert torch.equal(trainer.model.state_dict()[key], value), (side, key)


def _files_holding(root: Path, secret: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and secret in p.read_bytes()]


def test_the_token_reaches_no_file_no_push_and_no_output(hub, tmp_path, capfd, caplog):
    import logging

    caplog.set_level(logging.DEBUG, logger="hf_lightning")
    out_dir = tmp_path / "secret"
    trainer = _train("ours", out_dir, [WaitForPushes()], hub_model_id=f"{USER}/secret", hub_token=TOKEN,
                     hub_strategy="checkpoint", log_level="info")
    trainer.push_to_hub()
    print(repr(trainer.args), trainer.args)
    secret = TOKEN.encode()
    assert _files_holding(out_dir, secret) == []
    pushed = hub.state.tree(f"{USER}/secret")
    assert "last-checkpoint/training_args.bin" in pushed
    assert [path for path, content in pushed.items() if secret in content] == []
    captured = capfd.readouterr()
    assert TOKEN not in captured.out + captured.err + caplog.text


def test_the_reference_leaks_the_token_into_pushed_training_args(hub, scenario_runs):
    """The divergence we pin: the reference's pickled training_args.bin holds the token (docs/divergences.md)."""
    reference_tree = hub.state.tree(_repo("checkpoint", "ref"))
    assert TOKEN.encode() in reference_tree["last-checkpoint/training_args.bin"]
    our_tree = hub.state.tree(_repo("checkpoint", "ours"))
    assert TOKEN.encode() not in our_tree["last-checkpoint/training_args.bin"]
    assert TOKEN.encode() not in our_tree["training_args.bin"]


def test_hf_argument_parser_push_flags(hub, tmp_path):
    parser = hf_lightning.HfArgumentParser(hf_lightning.TrainingArguments)
    (args,) = parser.parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--push_to_hub", "--hub_model_id", f"{USER}/from-flags",
         "--hub_strategy", "checkpoint", "--use_cpu", "--report_to", "none"]
    )
    assert args.push_to_hub is True and args.hub_model_id == f"{USER}/from-flags"
    trainer = hf_lightning.Trainer(model=make_tiny_bert_classifier(), args=args)
    assert trainer.hub_model_id == f"{USER}/from-flags" and f"{USER}/from-flags" in hub.state.repos
    assert trainer.plan.notes["push_to_hub"].status == "honoured"
    assert trainer.plan.notes["hub_strategy"].status == "honoured"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_processes_push_from_rank_zero_only(hub, tmp_path):
    """Under a 2-process launch only rank 0 talks to the Hub (rank 1 runs offline: any request would fail)."""
    script = ROOT / "tests" / "distributed" / "hub_push_script.py"
    for side in SIDES:
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
            "--master_addr=127.0.0.1", str(script), side, str(tmp_path / side), f"{USER}/ddp-{side}",
        ]
        completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=os.environ)
        assert completed.returncode == 0, completed.stderr[-4000:]
        assert TOKEN not in completed.stdout + completed.stderr
    reference, ours = (_sequence(hub, f"{USER}/ddp-{side}") for side in SIDES)
    assert ours == reference
    assert [message for _, message, _, _ in ours] == [
        "Training in progress, step 2", "Training in progress, step 2, checkpoint", "End of training"
    ]


def test_a_failed_background_push_is_reported(hub, tmp_path, caplog):
    """A push to a branch that does not exist fails in the background: the reference says nothing, we warn."""
    import logging

    caplog.set_level(logging.WARNING)
    for side in SIDES:
        _train(side, tmp_path / side, [WaitForPushes()], hub_model_id=f"{USER}/no-branch-{side}",
               hub_revision="missing", max_steps=2)
    failures = [r for r in caplog.records if "background push to the Hub failed" in r.getMessage()]
    assert [r.name for r in failures] == ["hf_lightning.trainer.hub_methods"]
    assert "RevisionNotFound" in failures[0].getMessage() or "missing" in failures[0].getMessage()
    assert hub.state.commits_of(f"{USER}/no-branch-ours") == []


def test_scratch_of_a_save_in_progress_is_never_pushed(hub, tmp_path):
    """A push overlapping a save sees the save's scratch folder and save_state's temporary file: neither goes up."""
    out_dir = tmp_path / "scratch"
    args = hf_lightning.TrainingArguments(output_dir=str(out_dir), push_to_hub=True, hub_model_id=f"{USER}/scratch",
                                          use_cpu=True, report_to="none")
    trainer = hf_lightning.Trainer(model=make_tiny_bert_classifier(), args=args)
    for scratch in (".checkpoint-3.tmp-123", ".checkpoint-2.old-123", ".checkpoint-1.deleting-123", "checkpoint-3"):
        (out_dir / scratch).mkdir()
        (out_dir / scratch / "model.safetensors").write_bytes(b"partial")
    (out_dir / "trainer_state.json.tmp-123").write_text("{}")
    (out_dir / "_private.txt").write_text("not pushed by the reference either")
    trainer.push_to_hub()
    assert sorted(hub.state.tree(f"{USER}/scratch")) == [
        ".gitattributes", "README.md", "config.json", "model.safetensors", "training_args.bin"
    ]
