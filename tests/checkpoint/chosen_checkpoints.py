"""Which checkpoint a `train(resume_from_checkpoint=...)` chose: the run's resume connector records it, and the run
is gone once `train()` returns, so tests read it as the connector prepares it."""

from __future__ import annotations

import pytest

from hf_lightning.checkpoint.resume import Resumer


def record_chosen_checkpoints(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The checkpoint folder each later `train()` resumes from, in call order (runs that do not resume: none)."""
    chosen: list[str] = []
    prepare = Resumer.prepare

    def recording_prepare(self: Resumer, resume_from_checkpoint) -> None:
        prepare(self, resume_from_checkpoint)
        if self.files is not None:
            chosen.append(self.files.checkpoint)

    monkeypatch.setattr(Resumer, "prepare", recording_prepare)
    return chosen
