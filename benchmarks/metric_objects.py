"""evaluate() memory and speed with a torchmetrics `compute_metrics` against the reference's gathered logits.

    python benchmarks/metric_objects.py            # 4,000 and 16,000 samples, 2,000 classes, 3 repeats
    python benchmarks/metric_objects.py --smoke    # a tiny size; proves the script runs (timings meaningless)
    python benchmarks/metric_objects.py --readme   # then rewrite its table in benchmarks/README.md

A linear classifier (64 features -> 2,000 classes) is evaluated once, untimed, on a small set (imports and
one-off allocations), then once on the measured set. Runners, each a fresh subprocess pinned to one core with
one thread, interleaved across repeats:

- `transformers`: `transformers.Trainer` with a numpy `compute_metrics` (accuracy, macro F1): every logit of
  the evaluation is gathered on the host before it runs;
- `hf_lightning`: `hf_lightning.Trainer` with a `MetricCollection` of `MulticlassAccuracy` and
  `MulticlassF1Score` (macro), updated per batch;
- `hf_lightning_callable`: `hf_lightning.Trainer` with the reference's numpy `compute_metrics` (for reference).

Measured per run: the peak RSS growth during the measured `evaluate()` (a 1 ms sampler thread, and
`ru_maxrss` before / after; the larger), samples/s of that call, and the accuracy (which every runner must
agree on: the script exits non-zero otherwise). Targets: ours flat in the eval size (growth at the largest
size within 16 MiB of the smallest's), <= 0.1 x the reference's growth at 16,000 samples, samples/s >= the
reference's at every size.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# `python benchmarks/metric_objects.py` measures this checkout's hf_lightning, not an installed one.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
README = REPO / "benchmarks" / "README.md"
TABLE_START, TABLE_END = "<!-- metric-objects:start -->", "<!-- metric-objects:end -->"
RUNNERS = ("transformers", "hf_lightning", "hf_lightning_callable")
OURS, REFERENCE = "hf_lightning", "transformers"
FEATURES, EVAL_BATCH, WARM_UP_SAMPLES, SEED = 64, 256, 512, 42
FLAT_WITHIN_MB = 16.0
METRICS = ("accuracy", "f1")
SCALES = {
    "full": {"sizes": (4000, 16000), "classes": 2000, "repeats": 3},
    "smoke": {"sizes": (300, 600), "classes": 50, "repeats": 1},
}


# ---- one run (in its own process) -------------------------------------------------------------------------
def _model(classes: int):
    import torch
    from torch import nn

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Linear(FEATURES, classes)

        def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
            logits = self.head(x)
            out = {"logits": logits}
            if labels is not None:
                out["loss"] = nn.functional.cross_entropy(logits, labels)
            return out

    torch.manual_seed(SEED)
    return Classifier()


def _dataset(samples: int, classes: int, seed: int):
    import torch

    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=generator)
    labels = torch.randint(0, classes, (samples,), generator=generator)

    class Data(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return samples

        def __getitem__(self, index: int) -> dict[str, Any]:
            return {"x": x[index], "labels": labels[index]}

    return Data()


def numpy_metrics(classes: int, names: tuple[str, ...] = METRICS):
    """The reference's way: accuracy and macro F1 (those of `names`) from every gathered logit."""
    import numpy as np

    def compute_metrics(eval_prediction) -> dict[str, float]:
        predictions = np.argmax(eval_prediction.predictions, axis=-1)
        labels = eval_prediction.label_ids
        tp = np.bincount(labels[predictions == labels], minlength=classes)
        predicted = np.bincount(predictions, minlength=classes)
        actual = np.bincount(labels, minlength=classes)
        denominator = predicted + actual
        f1 = np.where(denominator > 0, 2 * tp / np.maximum(denominator, 1), 0.0)
        present = denominator > 0
        values = {"accuracy": float((predictions == labels).mean()), "f1": float(f1[present].mean())}
        return {name: values[name] for name in names}

    return compute_metrics


def metric_collection(classes: int, names: tuple[str, ...] = METRICS):
    """Ours: the same values from torchmetrics objects, updated per batch."""
    from torchmetrics import MetricCollection
    from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

    metrics = {
        "accuracy": lambda: MulticlassAccuracy(classes, average="micro"),
        "f1": lambda: MulticlassF1Score(classes, average="macro"),
    }
    return MetricCollection({name: metrics[name]() for name in names})


class PeakRss:
    """The peak RSS growth over a block: a 1 ms sampler thread, and `ru_maxrss` before and after."""

    def __enter__(self) -> PeakRss:
        import psutil

        self._process = psutil.Process()
        self.base = self._process.memory_info().rss
        self._maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            time.sleep(0.001)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        maxrss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        growth = max(self.peak - self.base, maxrss_after - max(self._maxrss_before, self.base))
        self.growth_mb = max(growth, 0) / 2**20


def run_one(runner: str, samples: int, classes: int, names: tuple[str, ...] = METRICS) -> dict[str, Any]:
    """One runner on one eval size: untimed warm-up evaluate(), then the measured one."""
    import torch

    torch.set_num_threads(1)
    if runner == "transformers":
        from transformers import Trainer, TrainingArguments

        compute_metrics: Any = numpy_metrics(classes, names)
    else:
        from hf_lightning import Trainer, TrainingArguments

        compute_metrics = (
            metric_collection(classes, names) if runner == OURS else numpy_metrics(classes, names)
        )
    with tempfile.TemporaryDirectory() as output_dir:
        args = TrainingArguments(
            output_dir=output_dir,
            use_cpu=True,
            report_to="none",
            disable_tqdm=True,
            per_device_eval_batch_size=EVAL_BATCH,
            dataloader_num_workers=0,
        )
        trainer = Trainer(model=_model(classes), args=args, compute_metrics=compute_metrics)
        trainer.evaluate(_dataset(WARM_UP_SAMPLES, classes, SEED + 1))
        data = _dataset(samples, classes, SEED + 2)
        with PeakRss() as rss:
            start = time.perf_counter()
            metrics = trainer.evaluate(data)
            seconds = time.perf_counter() - start
    return {
        "runner": runner,
        "samples": samples,
        "classes": classes,
        "rss_growth_mb": rss.growth_mb,
        "samples_per_s": samples / seconds,
        "evaluate_s": seconds,
        "accuracy": metrics["eval_accuracy"],
        "f1": metrics.get("eval_f1"),
    }


# ---- the suite (parent process) ---------------------------------------------------------------------------
def _spawn(
    runner: str, samples: int, classes: int, names: tuple[str, ...], core: str | None
) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(REPO))
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", runner, str(samples), str(classes)]
    command.append(",".join(names))
    if core is not None and sys.platform.startswith("linux"):
        command = ["taskset", "-c", core, *command]
    completed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if completed.returncode != 0:
        raise RuntimeError(f"{runner} at {samples} samples failed:\n{completed.stderr[-4000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def _median(results: list[dict[str, Any]], runner: str, samples: int, key: str) -> float:
    return statistics.median(r[key] for r in results if r["runner"] == runner and r["samples"] == samples)


def summarise(results: list[dict[str, Any]], sizes: tuple[int, ...]) -> dict[str, Any]:
    """Medians per runner and size, the accuracy agreement, and the targets (met / missed)."""
    table = {
        runner: {
            samples: {
                key: _median(results, runner, samples, key) for key in ("rss_growth_mb", "samples_per_s")
            }
            for samples in sizes
        }
        for runner in RUNNERS
    }
    accuracies = {round(r["accuracy"], 6) for r in results if r["samples"] == sizes[-1]}
    largest, smallest = sizes[-1], sizes[0]
    ours, reference = table[OURS], table[REFERENCE]
    growth_ratio = ours[largest]["rss_growth_mb"] / max(reference[largest]["rss_growth_mb"], 1e-9)
    flat = ours[largest]["rss_growth_mb"] - ours[smallest]["rss_growth_mb"]
    measured = [flat, growth_ratio] + [
        ours[samples]["samples_per_s"] / reference[samples]["samples_per_s"] for samples in sizes
    ]
    targets = summarise_targets_template(sizes)
    for target, value in zip(targets, measured):
        threshold = float(target["target"].split()[1])
        met = value <= threshold if target["target"].startswith("<=") else value >= threshold
        target.update(measured=value, met=met)
    return {"table": table, "accuracy_agrees": len(accuracies) == 1, "targets": targets}


def markdown(summary: dict[str, Any], scale: str, repeats: int) -> str:
    sizes = list(next(iter(summary["table"].values())))
    lines = [
        f"Scale `{scale}`, {repeats} repeat(s), medians; accuracy agreement: "
        f"{'yes' if summary['accuracy_agrees'] else 'NO'}.",
        "",
        "| runner | " + " | ".join(f"rss_growth_mb @{s} | samples_per_s @{s}" for s in sizes) + " |",
        "|---|" + "---|---|" * len(sizes),
    ]
    for runner, row in summary["table"].items():
        cells = " | ".join(f"{row[s]['rss_growth_mb']:.1f} | {row[s]['samples_per_s']:,.0f}" for s in sizes)
        lines.append(f"| {runner} | {cells} |")
    lines += [
        "",
        "| metric (hf_lightning with a MetricCollection) | baseline | target | measured | status |",
        "|---|---|---|---|---|",
    ]
    for target in summary["targets"]:
        status = "**met**" if target["met"] else "**missed**"
        lines.append(
            f"| {target['metric']} | {target['baseline']} | {target['target']} | {target['measured']:.3g} | {status} |"
        )
    return "\n".join(lines)


def target_rows(summary: dict[str, Any] | None) -> list[str]:
    """This benchmark's rows of the README's targets table (`benchmarks/report.py` appends them); "not measured"
    rows when no result was saved."""
    if summary is None:
        sizes = SCALES["full"]["sizes"]
        targets = summarise_targets_template(sizes)
    else:
        targets = summary["targets"]
    rows = []
    for target in targets:
        measured = "-" if target.get("measured") is None else f"{target['measured']:.3g}"
        status = "not measured" if target.get("met") is None else ("met" if target["met"] else "missed")
        rows.append(
            f"| metric_objects | {target['metric']} | {target['baseline']} | {target['target']} | {measured} | "
            f"**{status}** | - | - | - |"
        )
    return rows


def summarise_targets_template(sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    """The targets at `sizes`, unmeasured."""
    largest, smallest = sizes[-1], sizes[0]
    return [
        {
            "metric": f"rss_growth_mb @{largest} - @{smallest}",
            "baseline": OURS,
            "target": f"<= {FLAT_WITHIN_MB:g} MiB",
        },
        {"metric": f"rss_growth_mb @{largest}", "baseline": REFERENCE, "target": "<= 0.1"},
    ] + [
        {"metric": f"samples_per_s @{samples}", "baseline": REFERENCE, "target": ">= 1.0"}
        for samples in sizes
    ]


def _write_readme(text: str, summary: dict[str, Any]) -> None:
    """This benchmark's block, and its rows of the targets table, in benchmarks/README.md."""
    readme = README.read_text()
    start, end = readme.index(TABLE_START) + len(TABLE_START), readme.index(TABLE_END)
    readme = readme[:start] + "\n" + text + "\n" + readme[end:]
    rows = iter(target_rows(summary))
    lines = [
        next(rows, line) if line.startswith("| metric_objects |") else line for line in readme.split("\n")
    ]
    README.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, 1 repeat (timings meaningless)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--cpus", default="0", help="taskset cores, comma-separated; runs go one at a time")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "metric_objects.json"))
    parser.add_argument("--readme", action="store_true", help="rewrite the table in benchmarks/README.md")
    parser.add_argument(
        "--metrics", default=",".join(METRICS), help="comma-separated, of accuracy,f1 (default: both)"
    )
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.worker:
        runner, samples, classes, names = options.worker
        print(json.dumps(run_one(runner, int(samples), int(classes), tuple(names.split(",")))))
        return 0

    scale = "smoke" if options.smoke else "full"
    settings = SCALES[scale]
    repeats = options.repeats or settings["repeats"]
    core = options.cpus.split(",")[0] if options.cpus else None
    results = []
    for repeat in range(repeats):
        shift = repeat % len(RUNNERS)
        for samples in settings["sizes"]:
            for runner in RUNNERS[shift:] + RUNNERS[:shift]:
                result = _spawn(runner, samples, settings["classes"], tuple(options.metrics.split(",")), core)
                result["repeat"] = repeat
                results.append(result)
                print(
                    f"{runner:>22} {samples:>6} samples: +{result['rss_growth_mb']:.1f} MiB, "
                    f"{result['samples_per_s']:,.0f} samples/s, accuracy {result['accuracy']:.6f}",
                    flush=True,
                )
    summary = summarise(results, tuple(settings["sizes"]))
    text = markdown(summary, scale, repeats)
    print(text)
    out = Path(options.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"scale": scale, "results": results, "summary": summary}, indent=1, default=str)
    )
    if options.readme:
        _write_readme(text, summary)
    return 0 if summary["accuracy_agrees"] else 1


if __name__ == "__main__":
    sys.exit(main())
