"""What the public imports load: `import hf_lightning` loads no heavy package, and `from hf_lightning import
Trainer, TrainingArguments` loads torch (and numpy) but not Lightning, transformers or the Hub client, which
load when a run starts. benchmarks/import_time.py times it; this pins which packages are on the path."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("lightning", "lightning_fabric", "transformers", "accelerate", "torchmetrics", "huggingface_hub",
         "datasets", "safetensors", "torch", "numpy")


def _packages_after(statement: str) -> list[str]:
    probe = f"import json, sys\n{statement}\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    output = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    return [name for name in json.loads(output) if name in HEAVY]


def test_import_hf_lightning_loads_no_heavy_package():
    assert _packages_after("import hf_lightning") == []


def test_the_trainer_import_loads_torch_but_not_lightning_transformers_or_the_hub():
    assert _packages_after("from hf_lightning import Trainer, TrainingArguments") == ["numpy", "torch"]
