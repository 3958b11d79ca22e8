"""`hf-lightning fit` imports the user's own module from the working folder (`class_path: mydata.CountingData`),
as `python main.py fit` does for a LightningCLI user, though the console script's folder is its first path entry."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

USER_MODULE = textwrap.dedent(
    '''
    import torch

    class CountingData:
        """x -> labels = sum(x), in the DataSource shape (hf_lightning.cli_data.DataSource)."""

        train_dataset: object
        eval_dataset: object
        test_dataset: object
        data_collator: object

        def __init__(self, size: int = 16):
            x = torch.randn(size, 4, generator=torch.Generator().manual_seed(0))
            self.train_dataset = [{"x": x[i], "labels": x[i].sum()} for i in range(size)]
            self.eval_dataset = self.train_dataset[:8]
            self.test_dataset = None
            self.data_collator = None

    class Regressor(torch.nn.Module):
        def __init__(self, hidden: int = 8):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))

        def forward(self, x, labels=None):
            out = self.net(x).squeeze(-1)
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}
    '''
)
RUN_CONFIG = textwrap.dedent(
    """
    args: {output_dir: out, max_steps: 2, report_to: none, use_cpu: true, disable_tqdm: true}
    model: {class_path: mydata.Regressor}
    data: {class_path: mydata.CountingData, init_args: {size: 16}}
    """
)
# What pip writes as the `hf-lightning` console script: its own folder, not the working one, is sys.path[0].
CONSOLE_SCRIPT = "import sys\nfrom hf_lightning.cli.main import main\nsys.exit(main())\n"


def test_fit_finds_the_users_module_in_the_working_folder(tmp_path):
    work = tmp_path / "project"
    work.mkdir()
    (work / "mydata.py").write_text(USER_MODULE, encoding="utf-8")
    (work / "run.yaml").write_text(RUN_CONFIG, encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "hf-lightning").write_text(CONSOLE_SCRIPT, encoding="utf-8")
    completed = subprocess.run(
        [sys.executable, str(bin_dir / "hf-lightning"), "fit", "--config", "run.yaml"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "No module named 'mydata'" not in completed.stderr
    assert (work / "out" / "model.safetensors").is_file()
