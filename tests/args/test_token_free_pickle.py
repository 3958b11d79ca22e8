"""The arguments the reference's integration callbacks receive pickle without the token and otherwise as the
arguments (args/token_free_pickle.py); other callbacks receive the arguments themselves."""

from __future__ import annotations

import copy
import io
import pickle

import torch

from hf_lightning import TrainingArguments
from hf_lightning.args.token_free_pickle import token_free_pickle, write_back
from hf_lightning.callbacks.base import CallbackHandler, TrainerCallback
from hf_lightning.callbacks.flow import DefaultFlowCallback
from hf_lightning.callbacks.state import TrainerControl, TrainerState

TOKEN = "hf_unitTestSecret0123456789"


def _args(**overrides):
    return TrainingArguments(output_dir="out", use_cpu=True, report_to="none", hub_token=TOKEN, **overrides)


def _saved(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def test_the_view_pickles_without_the_token_as_the_arguments_class():
    args = _args(run_name="kept")
    view = token_free_pickle(args)
    assert view is not args and isinstance(view, TrainingArguments)
    assert view.hub_token == TOKEN and view.to_dict() == args.to_dict()
    data = _saved(view)
    assert TOKEN.encode() not in data and TOKEN.encode() in _saved(args)
    loaded = torch.load(io.BytesIO(data), weights_only=False)
    assert type(loaded) is TrainingArguments
    assert loaded.hub_token is None and loaded.run_name == "kept" and loaded.to_dict() == args.to_dict()
    assert TOKEN.encode() not in pickle.dumps(view, protocol=0)


def test_copies_of_the_view_keep_the_token_in_memory_only():
    view = token_free_pickle(_args())
    for clone in (copy.copy(view), copy.deepcopy(view), token_free_pickle(view)):
        assert clone.hub_token == TOKEN
        assert TOKEN.encode() not in _saved(clone)
        assert type(torch.load(io.BytesIO(_saved(clone)), weights_only=False)) is TrainingArguments


def test_no_token_no_view_and_changes_reach_the_arguments():
    plain = TrainingArguments(output_dir="out", use_cpu=True, report_to="none")
    assert token_free_pickle(plain) is plain
    args = _args(run_name="before")
    view = token_free_pickle(args)
    view.run_name = None  # what the reference's WandbCallback does in a hyperparameter search
    write_back(view, args)
    assert args.run_name is None and args.hub_token == TOKEN


class _Recorder(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        self.seen = args
        args.logging_dir = "changed"


def test_only_the_integration_callbacks_get_the_view():
    # A callback of the reference's integrations module (where its report_to callbacks live).
    integration_class = type("Integration", (_Recorder,), {"__module__": "transformers.integrations.integration_utils"})
    user, integration = _Recorder(), integration_class()
    handler = CallbackHandler([DefaultFlowCallback, user, integration], None, None, None, None)
    args = _args()
    handler.on_log(args, TrainerState(), TrainerControl(), logs={})
    assert user.seen is args
    assert integration.seen is not args and TOKEN.encode() not in _saved(integration.seen)
    assert args.logging_dir == "changed"
