"""Every layout's states read into one form (strategies/portable_state.py), the optimizer keyings translated through
the resuming optimizer's parameter order, the RNG files mapped when the process count changes, and consolidate's
refusals: the pure parts of resuming elsewhere, without launching processes (tests/strategies/test_resharding.py
runs the whole matrix)."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from torch import nn

from hf_lightning.checkpoint.consolidate import consolidate_checkpoint, default_output_dir
from hf_lightning.checkpoint.resume import warn_on_process_count_change
from hf_lightning.checkpoint.resume_files import rng_file_to_restore, saved_process_count
from hf_lightning.strategies.portable_state import (
    is_keyed_by_name,
    optimizer_parameter_names,
    optimizer_state_by_index,
    optimizer_state_by_name,
    parameter_name,
    read_full_model_state,
    read_full_optimizer_state,
)


def _model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 1))
    decay = [model[0].weight, model[2].weight]
    no_decay = [model[0].bias, model[1].weight, model[1].bias, model[2].bias]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-2
    )
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_optimizer_state_round_trips_between_index_and_name_keys():
    model, optimizer = _model_and_optimizer()
    names = optimizer_parameter_names(model, optimizer)
    assert names == [["0.weight", "2.weight"], ["0.bias", "1.weight", "1.bias", "2.bias"]]
    by_index = optimizer.state_dict()
    by_name = optimizer_state_by_name(by_index, names)
    assert is_keyed_by_name(by_name) and not is_keyed_by_name(by_index)
    torch.testing.assert_close(by_name["state"]["2.weight"]["exp_avg"], optimizer.state[model[2].weight]["exp_avg"])
    assert by_name["param_groups"][0]["weight_decay"] == 0.1
    back = optimizer_state_by_index(by_name, names)
    assert back["param_groups"] == by_index["param_groups"]
    assert set(back["state"]) == set(by_index["state"])
    for index, state in by_index["state"].items():
        for key, value in state.items():
            torch.testing.assert_close(back["state"][index][key], value)
    # Each keying is returned as it is when it already is the one asked for.
    assert optimizer_state_by_index(by_index, names) is by_index
    assert optimizer_state_by_name(by_name, names) is by_name


def test_a_name_keyed_state_loads_into_another_optimizers_order():
    """The resuming optimizer's order decides the indices: a state saved by name fits whatever order it has."""
    model, optimizer = _model_and_optimizer()
    by_name = optimizer_state_by_name(optimizer.state_dict(), optimizer_parameter_names(model, optimizer))
    reordered = torch.optim.AdamW(
        [
            {"params": [model[2].weight, model[0].weight], "weight_decay": 0.1},
            {"params": [model[2].bias, model[1].bias, model[1].weight, model[0].bias], "weight_decay": 0.0},
        ],
        lr=1e-2,
    )
    reordered.load_state_dict(optimizer_state_by_index(by_name, optimizer_parameter_names(model, reordered)))
    for param in model.parameters():
        torch.testing.assert_close(reordered.state[param]["exp_avg_sq"], optimizer.state[param]["exp_avg_sq"])


def test_groups_of_other_sizes_are_refused_by_name():
    model, optimizer = _model_and_optimizer()
    one_group = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with pytest.raises(ValueError, match=r"groups of sizes \[2, 4\], this run's optimizer \[6\]"):
        optimizer_state_by_name(optimizer.state_dict(), optimizer_parameter_names(model, one_group))


def test_wrapper_module_names_are_left_out():
    assert parameter_name("model._fsdp_wrapped_module.layers.0._checkpoint_wrapped_module.mlp.weight") == (
        "model.layers.0.mlp.weight"
    )
    assert parameter_name("_orig_mod.lm_head.weight") == "lm_head.weight"


def test_a_sharded_folder_is_merged_without_a_process_group(tmp_path):
    """A distributed checkpoint (saved here by one process, as FSDP's `optimizer_0/` names it) reads back whole."""
    import torch.distributed.checkpoint as dcp

    model, optimizer = _model_and_optimizer()
    by_name = optimizer_state_by_name(optimizer.state_dict(), optimizer_parameter_names(model, optimizer))
    with pytest.warns(UserWarning):
        dcp.save({"model": model.state_dict()}, storage_writer=dcp.FileSystemWriter(tmp_path / "pytorch_model_fsdp_0"), no_dist=True)
        dcp.save({"optimizer": by_name}, storage_writer=dcp.FileSystemWriter(tmp_path / "optimizer_0"), no_dist=True)
    weights = read_full_model_state(str(tmp_path))
    for key, value in model.state_dict().items():
        assert torch.equal(weights[key], value)
    optimizer_state = read_full_optimizer_state(str(tmp_path))
    assert optimizer_state["param_groups"][1]["params"] == by_name["param_groups"][1]["params"]
    assert torch.equal(optimizer_state["state"]["0.weight"]["exp_avg"], by_name["state"]["0.weight"]["exp_avg"])


@pytest.mark.parametrize(
    ("saved", "world_size", "expected"),
    [
        (["rng_state.pth"], 1, ["rng_state.pth"]),
        (["rng_state_0.pth", "rng_state_1.pth"], 2, ["rng_state_0.pth", "rng_state_1.pth"]),
        # Another count: process i takes the saving run's process i % saved.
        (["rng_state_0.pth", "rng_state_1.pth"], 1, ["rng_state_0.pth"]),
        (["rng_state.pth"], 2, ["rng_state.pth", "rng_state.pth"]),
        (["rng_state_0.pth", "rng_state_1.pth"], 3, ["rng_state_0.pth", "rng_state_1.pth", "rng_state_0.pth"]),
        ([], 2, [None, None]),
    ],
)
def test_rng_files_map_onto_another_process_count(tmp_path, saved, world_size, expected):
    for name in saved:
        (tmp_path / name).write_bytes(b"")
    assert saved_process_count(str(tmp_path)) == (len(saved) if saved != ["rng_state.pth"] else 1)
    assert [rng_file_to_restore(str(tmp_path), world_size, rank) for rank in range(world_size)] == expected


def test_another_process_count_is_warned_before_training(tmp_path, caplog):
    from types import SimpleNamespace

    for name in ("rng_state_0.pth", "rng_state_1.pth"):
        (tmp_path / name).write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="hf_lightning.checkpoint.resume"):
        warn_on_process_count_change(SimpleNamespace(world_size=2, process_index=0), str(tmp_path))
        assert not caplog.records
        warn_on_process_count_change(SimpleNamespace(world_size=1, process_index=0), str(tmp_path))
    assert "saved by 2 process(es) and this run has 1" in caplog.text
    assert "random draws" in caplog.text


def test_consolidate_refuses_a_folder_without_weights_and_its_own_folder(tmp_path):
    (tmp_path / "trainer_state.json").write_text("{}")
    with pytest.raises(ValueError, match="holds no model weights"):
        consolidate_checkpoint(str(tmp_path))
    torch.save({"w": torch.ones(2)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="other than the checkpoint itself"):
        consolidate_checkpoint(str(tmp_path), str(tmp_path))
    written = consolidate_checkpoint(str(tmp_path))
    assert written == default_output_dir(str(tmp_path)) == str(tmp_path) + "-consolidated"
    from safetensors.torch import load_file

    assert torch.equal(load_file(f"{written}/model.safetensors")["w"], torch.ones(2))


class _RunsCode:
    def __reduce__(self):
        return (os.getcwd, ())


def test_a_distributed_checkpoint_whose_metadata_holds_code_is_refused(tmp_path):
    """torch unpickles `.metadata` unrestricted; ours checks it first and refuses anything but checkpoint classes."""
    import pickle

    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "pytorch_model_fsdp_0"
    with pytest.warns(UserWarning):
        dcp.save({"model": {"w": torch.ones(2)}}, storage_writer=dcp.FileSystemWriter(folder), no_dist=True)
    assert torch.equal(read_full_model_state(str(tmp_path))["w"], torch.ones(2))
    (folder / ".metadata").write_bytes(pickle.dumps(_RunsCode()))
    with pytest.raises(ValueError, match=r"Refusing to load .*\.metadata"):
        read_full_model_state(str(tmp_path))


def test_a_deepspeed_checkpoint_is_refused_outside_deepspeed_even_with_weights(tmp_path):
    """Its optimizer state is in DeepSpeed's engine folder: resuming it elsewhere would restart the optimizer."""
    from hf_lightning.strategies.checkpoint_io import StrategyCheckpointIO
    from hf_lightning.strategies.fsdp.checkpoint import FSDPCheckpointIO

    torch.save({"w": torch.ones(2)}, tmp_path / "pytorch_model.bin")
    StrategyCheckpointIO().check_resumable(str(tmp_path))
    (tmp_path / "global_step4").mkdir()
    for io in (StrategyCheckpointIO(), FSDPCheckpointIO()):
        with pytest.raises(ValueError, match=r"DeepSpeed engine checkpoint .*ds_to_universal"):
            io.check_resumable(str(tmp_path))
