"""The facade's metric output methods: `log_metrics`, `save_metrics`, `metrics_format` (the reference's).

Same strings and files as transformers' `trainer_pt_utils` (METRICS-8), without importing it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from hf_lightning.checkpoint.metrics_files import metrics_format


class MetricsIOMixin:
    """`log_metrics` / `save_metrics` / `metrics_format` for the trainer facade (world process zero only).

    Needs `self.args.output_dir` and `self.is_world_process_zero()`.
    """

    # A staticmethod, so `trainer.metrics_format(m)` works; the reference stores the plain function on its class,
    # which makes the instance call raise TypeError (only `Trainer.metrics_format(m)` works there).
    metrics_format = staticmethod(metrics_format)

    def log_metrics(self, split: str, metrics: dict[str, Any]) -> None:
        """Print `***** {split} metrics *****` then one aligned `key = value` line per metric, keys sorted."""
        if not self.is_world_process_zero():
            return
        print(f"***** {split} metrics *****")
        formatted = metrics_format(metrics)
        key_width = max(len(str(key)) for key in formatted)
        value_width = max(len(str(value)) for value in formatted.values())
        for key in sorted(formatted.keys()):
            print(f"  {key: <{key_width}} = {formatted[key]:>{value_width}}")

    def save_metrics(self, split: str, metrics: dict[str, Any], combined: bool = True) -> None:
        """Write raw `metrics` to `{split}_results.json`; when `combined`, merge them into `all_results.json`."""
        if not self.is_world_process_zero():
            return
        path = os.path.join(self.args.output_dir, f"{split}_results.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(metrics, f, indent=4, sort_keys=True)
        if combined:
            path = os.path.join(self.args.output_dir, "all_results.json")
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    all_metrics = json.load(f)
            else:
                all_metrics = {}
            all_metrics.update(metrics)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(all_metrics, f, indent=4, sort_keys=True)
