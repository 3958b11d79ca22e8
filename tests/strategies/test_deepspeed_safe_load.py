"""DeepSpeed engine checkpoints are checked before the engine unpickles them without weights_only.

Real engine checkpoints (ZeRO-1/2/3) pass the same check in tests/strategies/test_deepspeed_strategy.py, whose resumes
and best-model loads go through it."""

from __future__ import annotations

import pytest
import torch
from deepspeed.runtime.fp16.loss_scaler import LossScaler
from deepspeed.runtime.zero.config import ZeroStageEnum

from hf_lightning.strategies.deepspeed.safe_load import TRUST_VARIABLE, verify_engine_checkpoint

MARKER = "payload-ran"


class Payload:
    """Unpickling this runs code: it writes a marker file (what a crafted checkpoint could do)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _engine_folder(tmp_path, payload: object) -> str:
    step = tmp_path / "checkpoint-2" / "global_step2"
    step.mkdir(parents=True)
    torch.save({"module": {"w": torch.ones(2)}, "ds_version": "0.19.8"}, step / "mp_rank_00_model_states.pt")
    torch.save(payload, step / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    return str(tmp_path / "checkpoint-2")


def test_the_engines_own_state_classes_pass(tmp_path, monkeypatch):
    monkeypatch.delenv(TRUST_VARIABLE, raising=False)
    state = {
        "loss_scaler": LossScaler(1.0),
        "zero_stage": ZeroStageEnum.gradients,
        "state": {0: torch.zeros(3)},
    }
    verify_engine_checkpoint(_engine_folder(tmp_path, state))


def test_a_crafted_file_is_refused_and_its_payload_never_runs(tmp_path, monkeypatch):
    monkeypatch.delenv(TRUST_VARIABLE, raising=False)
    marker = tmp_path / MARKER
    folder = _engine_folder(tmp_path, {"optimizer": Payload(str(marker))})
    with pytest.raises(ValueError, match=r"zero_pp_rank_0_mp_rank_00_optim_states\.pt.*" + TRUST_VARIABLE):
        verify_engine_checkpoint(folder)
    assert not marker.exists()


def test_the_user_can_trust_a_checkpoint_explicitly(tmp_path, monkeypatch):
    monkeypatch.setenv(TRUST_VARIABLE, "1")
    folder = _engine_folder(tmp_path, {"optimizer": Payload(str(tmp_path / MARKER))})
    verify_engine_checkpoint(folder)  # no check: the engine will load it as the reference does
    assert not (tmp_path / MARKER).exists()  # verifying did not load anything
