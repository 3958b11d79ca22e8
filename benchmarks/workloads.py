"""The benchmark workloads: models built from configs, synthetic data, fixed seeds, dropout 0.

Every runner builds its model and data here, from the same seed, so all runners start from the same
weights and visit the same examples in the same order; the final probe loss then proves they did the
same work. transformers is imported only by the workloads that need its model classes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, Sampler

SEED = 42
PAD_TOKEN_ID = 0

# Per scale: steps per workload, repeats, model size. "full" fits ~15 minutes on one pinned core,
# "quick" ~3 minutes, "smoke" proves the script works in a few seconds of work (timings meaningless).
SCALES: dict[str, dict[str, Any]] = {
    "full": {
        "repeats": 3,
        # tiny measures tenths of a millisecond per step: more repeats tighten its min-max (runs are short).
        "tiny_repeats": 7,
        # clm's 1.6 s steps vary by ~5% from run to run with the neighbour core's load: one more repeat.
        "clm_repeats": 4,
        # a 2-process step shares both cores with the other rank: its steps/s moves by +-15 % between runs.
        "ddp_repeats": 5,
        # a save takes about 0.1 s of file writes, whose time doubles or halves from one repeat to the next.
        "ckpt_repeats": 5,
        "tiny_steps": 1500,
        "cls_steps": 16,
        "clm_steps": 8,
        "eval_samples": 96,
        # evaluate() + predict() rounds per run: one round of 96 samples varies by +-10% between runs.
        "eval_rounds": 3,
        "resume_tries": 3,
        # 12 steps, 11 intervals between step ends: with 6 the median of 5 intervals moved by +-5% between repeats.
        "ddp_steps": 12,
        "resume_positions": (10, 1000, 10000),
        "model": "full",
    },
    "quick": {
        "repeats": 1,
        "tiny_steps": 400,
        "cls_steps": 6,
        "clm_steps": 3,
        "eval_samples": 32,
        "eval_rounds": 1,
        "resume_tries": 2,
        "ddp_steps": 4,
        "resume_positions": (10, 1000, 10000),
        "model": "full",
    },
    "smoke": {
        "repeats": 1,
        "tiny_steps": 30,
        "cls_steps": 3,
        "clm_steps": 2,
        "eval_samples": 16,
        "eval_rounds": 1,
        "resume_tries": 1,
        "ddp_steps": 2,
        "resume_positions": (5, 10),
        "model": "small",
    },
}

# Transformer sizes. The vocabulary is small on purpose: on one CPU core a 50k-token LM head would be
# most of the step, and the suite measures the trainers around the model, not the model.
MODEL_SIZES: dict[str, dict[str, int]] = {
    "full": {"layers": 4, "hidden": 256, "heads": 4, "seq": 128, "vocab": 2048},
    "small": {"layers": 1, "hidden": 32, "heads": 2, "seq": 16, "vocab": 128},
}


@dataclass
class Workload:
    """One training workload: how to build its model and data, and its trainer arguments."""

    name: str
    batch_size: int
    grad_accum: int
    max_steps: int
    learning_rate: float
    logging_steps: int
    num_examples: int
    build_model: Callable[[], nn.Module]
    build_dataset: Callable[[int, int], Dataset]  # (num_examples, seed) -> dataset
    # Whether the reference passes `num_items_in_batch` to this model's forward (its forward takes
    # **kwargs) and counts the window's labels shifted by one (causal LM).
    passes_num_items: bool = False
    shifts_labels: bool = False
    eval_batch_size: int = 32
    extra: dict[str, Any] = field(default_factory=dict)

    def seeded_model(self) -> nn.Module:
        """The model, initialised from `SEED` so every runner starts from the same weights."""
        torch.manual_seed(SEED)
        return self.build_model()

    def train_dataset(self) -> Dataset:
        return self.build_dataset(self.num_examples, SEED)

    def probe_batch(self) -> dict[str, torch.Tensor]:
        """A fixed held-out batch; its loss after training is the runners' agreement check."""
        dataset = self.build_dataset(self.batch_size, SEED + 1)
        return stack_collate([dataset[i] for i in range(len(dataset))])

    def trainer_args(self, output_dir: str) -> dict[str, Any]:
        """The arguments given to both transformers.Trainer and hf_lightning (the very same values)."""
        return {
            "output_dir": output_dir,
            "per_device_train_batch_size": self.batch_size,
            "gradient_accumulation_steps": self.grad_accum,
            "max_steps": self.max_steps,
            "learning_rate": self.learning_rate,
            "logging_steps": self.logging_steps,
            "save_strategy": "no",
            "report_to": "none",
            "disable_tqdm": True,
            "dataloader_pin_memory": False,
            "seed": SEED,
        }


# ---- data ------------------------------------------------------------------------------------------------
class TensorDictDataset(Dataset):
    """Examples stored as stacked tensors; `__getitem__` returns a dict of per-example tensors."""

    def __init__(self, columns: Mapping[str, torch.Tensor]):
        self.columns = dict(columns)
        self._length = len(next(iter(self.columns.values())))

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: column[index] for name, column in self.columns.items()}


def stack_collate(features: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The reference's `default_data_collator` for dicts of tensors: stack each key."""
    return {key: torch.stack([f[key] for f in features]) for key in features[0]}


class EpochSeededSampler(Sampler[int]):
    """The reference's train order: `randperm(N, Generator(seed + epoch))` (accelerate's seedable sampler)."""

    def __init__(self, num_examples: int, seed: int = SEED):
        self.num_examples = num_examples
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_examples

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        yield from torch.randperm(self.num_examples, generator=generator).tolist()


def window_item_counts(
    dataset: TensorDictDataset, batch_size: int, grad_accum: int, epochs: int, shifts_labels: bool
) -> list[list[torch.Tensor]]:
    """Per epoch, per accumulation window: the number of labels != -100, counted as the reference does.

    The bare Lightning runner needs it before the window's first micro-batch (automatic optimization
    sees one micro-batch at a time); replaying the sampler's order makes it exact.
    """
    labels = dataset.columns["labels"]
    per_example = (labels[:, 1:] if shifts_labels else labels).ne(-100).flatten(1).sum(dim=1)
    counts = []
    for epoch in range(epochs):
        sampler = EpochSeededSampler(len(dataset))
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler))
        window = batch_size * grad_accum
        counts.append([per_example[order[i : i + window]].sum() for i in range(0, len(order), window)])
    return counts


def _regression_dataset(num_examples: int, seed: int, in_features: int = 32) -> TensorDictDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_examples, in_features, generator=generator)
    weight = torch.randn(in_features, 1, generator=torch.Generator().manual_seed(SEED))
    y = torch.sin(x @ weight) + 0.1 * torch.randn(num_examples, 1, generator=generator)
    return TensorDictDataset({"x": x, "labels": y})


def _classification_dataset(num_examples: int, seed: int, seq: int, vocab: int) -> TensorDictDataset:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, vocab, (num_examples, seq), generator=generator)
    labels = torch.randint(0, 2, (num_examples,), generator=generator)
    return TensorDictDataset(
        {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}
    )


def _causal_lm_dataset(num_examples: int, seed: int, seq: int, vocab: int) -> TensorDictDataset:
    """Right-padded sequences of random length in [seq/4, seq]; padding masked out of the labels."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, vocab, (num_examples, seq), generator=generator)
    lengths = torch.randint(seq // 4, seq + 1, (num_examples,), generator=generator)
    attention_mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    input_ids = input_ids.masked_fill(attention_mask == 0, PAD_TOKEN_ID)
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return TensorDictDataset({"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels})


# ---- models ----------------------------------------------------------------------------------------------
class MLPRegressor(nn.Module):
    """Two linear layers with a ReLU; returns the MSE loss in a dict like a transformers model."""

    def __init__(self, in_features: int = 32, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        prediction = self.net(x)
        output = {"logits": prediction}
        if labels is not None:
            output = {"loss": nn.functional.mse_loss(prediction, labels), **output}
        return output


def _bert_classifier(size: dict[str, int]) -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=size["vocab"],
        hidden_size=size["hidden"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        intermediate_size=4 * size["hidden"],
        max_position_embeddings=size["seq"],
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        classifier_dropout=0.0,
        num_labels=2,
        pad_token_id=PAD_TOKEN_ID,
    )
    return BertForSequenceClassification(config)


def _gpt2_lm(size: dict[str, int]) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=size["vocab"],
        n_embd=size["hidden"],
        n_layer=size["layers"],
        n_head=size["heads"],
        n_positions=size["seq"],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=size["vocab"] - 1,
        eos_token_id=size["vocab"] - 1,
        pad_token_id=PAD_TOKEN_ID,
    )
    return GPT2LMHeadModel(config)


# ---- the workloads ---------------------------------------------------------------------------------------
TRAIN_WORKLOADS = ("tiny", "cls", "clm")
ALL_WORKLOADS = (*TRAIN_WORKLOADS, "eval", "ckpt", "ddp", "resume")


def build_workload(name: str, scale: str, steps: int | None = None) -> Workload:
    """The workload `name` ("tiny", "cls", "clm"; "eval" and "ckpt" reuse "cls"; "ddp" runs "cls" and "clm"
    on 2 processes, "resume" the "tiny" model) at `scale`.

    `steps` overrides the scale's step count of a training workload (the data grows to match).
    """
    settings = dict(SCALES[scale])
    if name == "ddp":  # benchmarks/ddp_runners.py builds "cls" and "clm" in each rank
        ddp_steps = settings["ddp_steps"]
        return Workload(
            name="ddp", batch_size=0, grad_accum=1, max_steps=ddp_steps, learning_rate=0.0, logging_steps=1,
            num_examples=0, build_model=MLPRegressor, build_dataset=_regression_dataset, extra={"scale": scale},
        )
    if name == "resume":  # benchmarks/resume_runners.py: the tiny model, batch 4, resumed mid-epoch
        return Workload(
            name="resume", batch_size=4, grad_accum=1, max_steps=2, learning_rate=1e-3, logging_steps=50,
            num_examples=0, build_model=MLPRegressor, build_dataset=_regression_dataset,
            extra={"positions": tuple(settings["resume_positions"]), "tries": settings["resume_tries"]},
        )
    if steps is not None:
        settings.update(tiny_steps=steps, cls_steps=steps, clm_steps=steps)
    size = MODEL_SIZES[settings["model"]]
    if name == "tiny":
        steps = settings["tiny_steps"]
        batch = 64
        # Several epochs (250 updates each at full scale) so epoch boundaries are part of the run.
        per_epoch = min(250, steps)
        return Workload(
            name="tiny",
            batch_size=batch,
            grad_accum=1,
            max_steps=steps,
            learning_rate=1e-3,
            logging_steps=50,
            num_examples=batch * per_epoch,
            build_model=MLPRegressor,
            build_dataset=_regression_dataset,
        )
    if name in ("cls", "eval", "ckpt"):
        # ckpt saves at steps 2 and 4: the first save of a process, then a warm one.
        steps = settings["cls_steps"] if name == "cls" else 4 if name == "ckpt" else 2
        batch = 16
        return Workload(
            name=name,
            batch_size=batch,
            grad_accum=1,
            max_steps=steps,
            learning_rate=5e-5,
            logging_steps=max(1, steps // 2) if name == "cls" else 100,
            num_examples=batch * max(steps + 1, 4),
            build_model=lambda: _bert_classifier(size),
            build_dataset=lambda n, seed: _classification_dataset(n, seed, size["seq"], size["vocab"]),
            eval_batch_size=16,
            extra={
                "eval_samples": settings["eval_samples"],
                "eval_rounds": settings["eval_rounds"],
                "resume_tries": settings["resume_tries"],
            },
        )
    if name == "clm":
        steps = settings["clm_steps"]
        batch, grad_accum = 8, 4
        return Workload(
            name="clm",
            batch_size=batch,
            grad_accum=grad_accum,
            max_steps=steps,
            learning_rate=5e-4,
            logging_steps=max(1, steps // 2),
            num_examples=batch * grad_accum * steps,
            build_model=lambda: _gpt2_lm(size),
            build_dataset=lambda n, seed: _causal_lm_dataset(n, seed, size["seq"], size["vocab"]),
            passes_num_items=True,
            shifts_labels=True,
        )
    raise ValueError(f"workload={name!r} is unknown; choose one of {', '.join(ALL_WORKLOADS)}.")


def epochs_needed(workload: Workload) -> int:
    """How many epochs `max_steps` updates span."""
    updates_per_epoch = workload.num_examples // (workload.batch_size * workload.grad_accum)
    return math.ceil(workload.max_steps / updates_per_epoch)


@torch.no_grad()
def probe_loss(model: nn.Module, workload: Workload) -> float:
    """The trained model's loss on the probe batch (eval mode; dropout is 0 anyway)."""
    was_training = model.training
    model.eval()
    output = model(**workload.probe_batch())
    loss = output["loss"] if isinstance(output, Mapping) else output[0]
    model.train(was_training)
    return float(loss)
