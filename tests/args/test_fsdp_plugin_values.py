"""The one FSDP plugin computation refuses, when the arguments are built, the `fsdp_config` values the
reference accepts there and accelerate's plugin (or torch) fails on later; the message names the key."""

from __future__ import annotations

import pytest
import transformers

from hf_lightning import TrainingArguments
from hf_lightning.translation.handlers.distributed import fsdp_plugin_args

REFUSED_LATER_BY_THE_REFERENCE = [
    ({"state_dict_type": "LOCAL_STATE_DICT"}, "state_dict_type"),
    ({"version": 3}, "version"),
    ({"version": 1, "backward_prefetch": "later"}, "backward_prefetch"),
    ({"version": 1, "reshard_after_forward": "sometimes"}, "reshard_after_forward"),
]


@pytest.mark.parametrize(("config", "key"), REFUSED_LATER_BY_THE_REFERENCE)
def test_values_the_plugin_cannot_take_are_refused_when_the_arguments_are_built(tmp_path, config, key):
    reference = transformers.TrainingArguments(str(tmp_path), fsdp=True, fsdp_config=dict(config))
    assert reference.fsdp_plugin_args is not None  # the reference's arguments accept it
    with pytest.raises(ValueError, match=rf"fsdp_config\['{key}'\]"):
        TrainingArguments(str(tmp_path), fsdp=True, fsdp_config=dict(config))


def test_a_value_that_is_not_a_truth_value_names_its_key(tmp_path):
    config = {"version": 1, "forward_prefetch": "maybe"}
    with pytest.raises(ValueError, match="invalid truth value"):
        transformers.TrainingArguments(str(tmp_path), fsdp=True, fsdp_config=dict(config))
    with pytest.raises(ValueError, match=r"fsdp_config\['forward_prefetch'\]='maybe' is not a truth value"):
        TrainingArguments(str(tmp_path), fsdp=True, fsdp_config=dict(config))


def test_the_arguments_and_the_plan_hold_one_computation(tmp_path):
    config = {"fsdp_version": 1, "backward_prefetch": "backward_pre", "transformer_layer_cls_to_wrap": "BertLayer"}
    args = TrainingArguments(str(tmp_path), fsdp="shard_grad_op", fsdp_config=dict(config))
    assert args.fsdp_plugin_args == fsdp_plugin_args(args)
    raw = type("Raw", (), {"fsdp": "shard_grad_op", "fsdp_config": dict(config)})()
    assert fsdp_plugin_args(raw) == args.fsdp_plugin_args
