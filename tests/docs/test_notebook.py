"""notebooks/quickstart.ipynb runs top to bottom in a Jupyter kernel of this interpreter (nbclient), and shows
the metrics it promises."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "quickstart.ipynb"


def _kernel_manager(tmp_path: Path) -> KernelManager:
    """A kernel spec written to tmp_path that starts *this* interpreter with this checkout importable,
    so no `python -m ipykernel install` (and no kernel spec of the machine) is involved."""
    spec_dir = tmp_path / "kernels" / "hf-lightning-test"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "hf_lightning tests",
        "language": "python",
        "env": {"PYTHONPATH": str(REPO)},
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")], ensure_native_kernel=False)
    return KernelManager(kernel_name="hf-lightning-test", kernel_spec_manager=specs)


def _texts(cell) -> str:
    """Everything a code cell showed, as text: streams, reprs and HTML."""
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            parts.extend(str(output.data.get(kind, "")) for kind in ("text/plain", "text/html"))
    return "\n".join(parts)


def test_quickstart_notebook_runs_and_reports_its_metrics(tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code_cells)  # committed clean

    workdir = tmp_path / "work"
    workdir.mkdir()
    client = NotebookClient(
        notebook,
        km=_kernel_manager(tmp_path),
        timeout=120,
        allow_errors=False,  # a cell that raises fails the test with its traceback
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute()

    assert not [output for cell in code_cells for output in cell.outputs if output.output_type == "error"]
    shown = [_texts(cell) for cell in code_cells]
    everything = "\n".join(shown)
    assert "from hf_lightning import Trainer" in code_cells[0].source
    # train(): TrainOutput with the train metrics; the notebook progress table has a row per epoch
    assert "TrainOutput(global_step=150" in everything and "'train_loss'" in everything
    assert "<th>Validation Loss</th>" in everything and "<th>Accuracy</th>" in everything
    # evaluate() and predict()
    assert "'eval_loss'" in everything and "'eval_accuracy'" in everything
    assert "'test_loss'" in everything and "'test_accuracy'" in everything
    # the plot is shown once, as an image
    images = [
        output for cell in code_cells for output in cell.outputs if "image/png" in output.get("data", {})
    ]
    assert len(images) == 1
    # resuming from the first checkpoint (epoch 1) ends where the uninterrupted run ended, to the last bit
    assert "['checkpoint-50', 'checkpoint-100', 'checkpoint-150']" in everything
    assert "resumed run: 150 steps; uninterrupted run: 150" in everything
    resumed, uninterrupted = re.search(
        r"eval_loss after resuming: (\S+) uninterrupted: (\S+)", everything
    ).groups()
    assert float(resumed) == float(uninterrupted)
    assert (workdir / "quickstart_output" / "checkpoint-150").is_dir()
