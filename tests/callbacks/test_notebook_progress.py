"""NotebookProgressCallback: chosen inside a Jupyter kernel only, and draws the reference's HTML (checked
against transformers' NotebookProgressCallback fed the same events, both on a fake IPython display)."""

from __future__ import annotations

import importlib.machinery
import re
import sys
import types

import pytest

from hf_lightning import TrainingArguments
from hf_lightning.callbacks import ProgressCallback, notebook
from hf_lightning.callbacks.notebook import (
    NotebookProgressCallback,
    default_progress_callback,
    is_in_notebook,
)
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.models import make_regression_mlp, regression_data


class FakeDisplay:
    """Stands in for IPython.display: records every display handle and the HTML it was given."""

    def __init__(self):
        self.handles = []
        display = self

        class HTML:
            def __init__(self, data):
                self.data = data

        class Handle:
            def __init__(self, owner):
                self.owner = owner  # which callback module drew it
                self.updates = []

            def update(self, obj):
                self.updates.append(obj.data)

        def display_(obj, display_id=False):
            handle = Handle(sys._getframe(1).f_globals["__name__"])
            handle.updates.append(obj.data)
            display.handles.append(handle)
            return handle if display_id else None

        self.module = types.ModuleType("IPython.display")
        self.module.HTML = HTML
        self.module.display = display_


def _fake_ipython(monkeypatch, in_kernel=True):
    fake = FakeDisplay()
    shell = types.SimpleNamespace(config={"IPKernelApp": {}} if in_kernel else {"TerminalIPythonApp": {}})
    ipython = types.ModuleType("IPython")
    ipython.__spec__ = importlib.machinery.ModuleSpec("IPython", None)  # find_spec("IPython") reads it
    ipython.get_ipython = lambda: shell
    ipython.display = fake.module
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "IPython.display", fake.module)
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    return fake


def _trainer(tmp_path, callbacks=None, **kwargs):
    settings = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        learning_rate=1e-2,
        logging_steps=1,
    )
    settings.update(kwargs)
    return HFLightningTrainer(
        model=make_regression_mlp(),
        args=TrainingArguments(**settings),
        train_dataset=regression_data(8),
        eval_dataset=regression_data(4, seed=1),
        callbacks=callbacks,
    )


def test_detection_follows_the_reference(monkeypatch):
    from transformers.utils.import_utils import is_in_notebook as cached_reference

    def reference():
        cached_reference.cache_clear()  # the reference caches its answer for the process
        return cached_reference()

    monkeypatch.delitem(sys.modules, "marimo", raising=False)
    _fake_ipython(monkeypatch, in_kernel=True)
    assert is_in_notebook() and reference()
    assert default_progress_callback() is NotebookProgressCallback
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "10.4")  # old Databricks: no kernel
    assert not is_in_notebook() and not reference()
    _fake_ipython(monkeypatch, in_kernel=False)  # terminal IPython
    assert not is_in_notebook() and not reference()
    assert default_progress_callback() is ProgressCallback
    monkeypatch.setitem(sys.modules, "IPython", None)  # not imported (and not importable)
    assert not is_in_notebook() and not reference()
    cached_reference.cache_clear()


def test_outside_a_notebook_ipython_is_never_imported(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "IPython", None)  # any `import IPython` now raises ImportError
    monkeypatch.setitem(sys.modules, "IPython.display", None)
    trainer = _trainer(tmp_path, max_steps=2, eval_strategy="steps", eval_steps=2)
    assert any(isinstance(cb, ProgressCallback) for cb in trainer.callback_handler.callbacks)
    assert not any(isinstance(cb, NotebookProgressCallback) for cb in trainer.callback_handler.callbacks)
    trainer.train()
    trainer.evaluate()


def _table(html):
    match = re.search(r"<table.*</table>", html, re.S)
    return match.group(0) if match else None


def _bar(html):
    return re.findall(r"<progress value='(\d+)' max='(\d+)'", html)


@pytest.mark.parametrize(
    "settings",
    [
        {"max_steps": 4, "eval_strategy": "steps", "eval_steps": 2},
        {"num_train_epochs": 2, "eval_strategy": "epoch"},
        {"max_steps": 3, "eval_strategy": "no"},
    ],
    ids=["steps", "epoch", "no-eval"],
)
def test_html_equals_the_reference_callback(tmp_path, monkeypatch, settings):
    import transformers.utils.notebook as reference_notebook

    fake = _fake_ipython(monkeypatch)
    monkeypatch.setattr(reference_notebook, "disp", fake.module)  # in case it was imported before
    # Redraw on every update: the bars' throttling depends on wall-clock time, which differs between the two.
    monkeypatch.setattr(reference_notebook.NotebookProgressBar, "update_every", 0.0)
    monkeypatch.setattr(notebook.NotebookProgressBar, "update_every", 0.0)
    reference = reference_notebook.NotebookProgressCallback()
    trainer = _trainer(tmp_path, callbacks=[reference], **settings)
    ours = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, NotebookProgressCallback)]
    assert len(ours) == 1 and not any(
        type(cb) is ProgressCallback for cb in trainer.callback_handler.callbacks
    )
    trainer.train()
    metrics = trainer.evaluate()

    by_owner = {}
    for handle in fake.handles:
        by_owner.setdefault(handle.owner, []).append(handle)
    mine, theirs = by_owner["hf_lightning.callbacks.notebook"], by_owner["transformers.utils.notebook"]
    # the training tracker, then evaluate()'s own bar and its standalone table
    assert len(mine) == len(theirs) == 3
    for our_handle, their_handle in zip(mine, theirs):
        final_ours, final_theirs = our_handle.updates[-1], their_handle.updates[-1]
        assert _table(final_ours) == _table(final_theirs)
        assert _bar(final_ours) == _bar(final_theirs)
        assert [_bar(html) for html in our_handle.updates] == [_bar(html) for html in their_handle.updates]

    history = trainer.state.log_history
    table = _table(mine[0].updates[-1])
    assert "<th>Training Loss</th>" in table
    last_loss = [entry["loss"] for entry in history if "loss" in entry][-1]
    assert f"<td>{last_loss:.6f}</td>" in table
    if settings["eval_strategy"] != "no":
        assert "<th>Validation Loss</th>" in table
        for entry in history[:-1]:
            if "eval_loss" in entry:
                assert f"<td>{entry['eval_loss']:.6f}</td>" in table
    # The reference's quirk, kept: on_evaluate strips speed keys and epoch from the dict evaluate() returns.
    assert "eval_loss" in metrics and "eval_runtime" not in metrics and "epoch" not in metrics
    assert f"<td>{metrics['eval_loss']:.6f}</td>" in _table(mine[2].updates[-1])


def test_the_training_table_shows_the_telemetrys_last_window(tmp_path, monkeypatch):
    fake = _fake_ipython(monkeypatch)
    monkeypatch.setattr(notebook.NotebookProgressBar, "update_every", 0.0)
    trainer = _trainer(tmp_path, max_steps=4, logging_steps=2, disable_tqdm=False)
    assert any(isinstance(cb, NotebookProgressCallback) for cb in trainer.callback_handler.callbacks)
    trainer.train()
    updates = fake.handles[0].updates
    # From the step after the first window on, the comment holds its throughput (samples/s: no tokens here).
    assert any("Epoch" in html and "samples/s=" in html for html in updates)
    assert "samples/s=" not in updates[0]
