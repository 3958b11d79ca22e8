"""``TrainingArguments`` and ``Seq2SeqTrainingArguments``: the reference's arguments, without transformers.

Same fields, order and defaults as transformers 5.24 (see ``args/declarations.py``), the same
``__post_init__`` normalisation (R1.2), validation (``args/reference_rules.py``: the reference's rules, after
``args/validation.py``: our checks of every field's type, range and combinations, which the reference leaves to
``train()``), v4 keyword aliases
(``args/aliases.py``), serialisation and helpers. Unlike the reference, building the arguments does
not set up accelerate or a process group: the process layout is read from the launcher's env
variables, and the device is derived lazily (``args/process.py``).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import math
import os
import sys
import warnings
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any

from hf_lightning.args.accelerator_config import AcceleratorConfig, to_accelerator_config
from hf_lightning.args.aliases import ALIAS_ATTRIBUTE_DEFAULTS, with_v4_aliases
from hf_lightning.args.declarations import TrainingArgumentsFields, convert_str_dict
from hf_lightning.args.deepspeed_config import (
    DeepSpeedPluginView,
    deepspeed_fill_at_construction,
    load_deepspeed_config,
)
from hf_lightning.args.parallel import process_fsdp_args
from hf_lightning.args.process import TrainingArgumentsProcess, mps_available, transformers_verbosity
from hf_lightning.args.reference_rules import (
    accelerator_assumed,
    check_eval_steps_available,
    check_tf32_supported,
    to_enum,
    validate_arguments,
)
from hf_lightning.args.setters import TrainingArgumentsSetters
from hf_lightning.args.user_warnings import user_stacklevel
from hf_lightning.args.validation import check_values
from hf_lightning.core.enums import (
    DebugOption,
    HubStrategy,
    IntervalStrategy,
    OptimizerNames,
    SaveStrategy,
    SchedulerType,
    enum_value,
)

logger = logging.getLogger(__name__)

__all__ = ["Seq2SeqTrainingArguments", "TrainingArguments", "as_training_arguments"]

_SEQ2SEQ_FIELDS = (
    "sortish_sampler",
    "predict_with_generate",
    "generation_max_length",
    "generation_num_beams",
)


def _available_reporting_integrations() -> list[str]:
    """Names the reference's ``report_to="all"`` expands to on this machine (same checks, same order)."""

    def installed(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    mlflow = installed("mlflow") and os.getenv("DISABLE_MLFLOW_INTEGRATION", "FALSE").upper() != "TRUE"
    checks = [
        ("azure_ml", installed("azureml") and installed("azureml.core") and not mlflow),
        ("comet_ml", installed("comet_ml") and os.getenv("COMET_API_KEY") is not None),
        ("dagshub", installed("dagshub") and installed("mlflow")),
        ("dvclive", installed("dvclive")),
        ("mlflow", mlflow),
        ("neptune", installed("neptune")),
        ("tensorboard", installed("tensorboard") or installed("tensorboardX")),
        ("wandb", installed("wandb")),
        ("codecarbon", installed("codecarbon")),
        ("clearml", installed("clearml")),
        ("swanlab", installed("swanlab")),
        ("trackio", installed("trackio")),
        ("kubeflow", _kubeflow_enabled()),
    ]
    return [name for name, ok in checks if ok]


def _kubeflow_enabled() -> bool:
    if os.getenv("DISABLE_KUBEFLOW_INTEGRATION", "FALSE").upper() == "TRUE":
        return False
    return os.getenv("KUBEFLOW_TRAINER_SERVER_URL") is not None


def _apply_tf32(enable: bool) -> None:
    """Switch TF32 matmuls the way the reference's ``enable_tf32`` does (not while the arguments are checked for
    another machine: `hf-lightning explain --accelerator gpu` leaves this one's TF32 as it is)."""
    import torch

    if accelerator_assumed():
        return

    if hasattr(torch.backends, "fp32_precision"):  # torch >= 2.9
        torch.backends.fp32_precision = "tf32" if enable else "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = enable
        torch.backends.cudnn.allow_tf32 = enable


@with_v4_aliases
@dataclass
class TrainingArguments(TrainingArgumentsSetters, TrainingArgumentsProcess, TrainingArgumentsFields):
    """The reference's ``TrainingArguments`` (transformers 5.24): fields, normalisation, validation, helpers.

    v4 keywords (``evaluation_strategy``, ``warmup_ratio``, ``no_cuda``, ...) are accepted by the
    constructor with a ``FutureWarning``; see ``hf_lightning.args.aliases``.
    """

    def __post_init__(self) -> None:
        # 0. Every field's type, range, choices and combinations, on the values as given (all problems at once).
        check_values(self)
        # 1. Defaults and JSON strings.
        if self.output_dir is None:
            self.output_dir = "trainer_output"
        for name in self._VALID_DICT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, str) and value.startswith("{"):
                setattr(self, name, convert_str_dict(json.loads(value)))
        # Attributes the v4 aliases may have set already; every instance has them.
        for name, default in ALIAS_ATTRIBUTE_DEFAULTS.items():
            if not hasattr(self, name):
                setattr(self, name, default)

        # 2. `gradient_checkpointing*` are deprecated aliases used only when the new name is unset; then
        # the old names mirror the new ones.
        for old, new in (
            ("gradient_checkpointing", "activation_checkpointing"),
            ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
        ):
            if getattr(self, new) is None and getattr(self, old) is not None:
                warnings.warn(
                    f"`{old}` is deprecated and will be removed in v6. Use `{new}` instead.",
                    FutureWarning,
                    stacklevel=user_stacklevel(),
                )
                setattr(self, new, getattr(self, old))
            setattr(self, old, getattr(self, new))
        if self.activation_checkpointing is None:
            self.activation_checkpointing = self.gradient_checkpointing = False

        self.output_dir = os.path.expanduser(self.output_dir)
        if self.disable_tqdm is None:
            self.disable_tqdm = transformers_verbosity("transformers.training_args") > logging.WARNING
        if isinstance(self.include_num_input_tokens_seen, bool):
            self.include_num_input_tokens_seen = "all" if self.include_num_input_tokens_seen else "no"

        # 3. Enums (V13).
        self.eval_strategy = to_enum(IntervalStrategy, self.eval_strategy, "eval_strategy")
        self.logging_strategy = to_enum(IntervalStrategy, self.logging_strategy, "logging_strategy")
        self.save_strategy = to_enum(SaveStrategy, self.save_strategy, "save_strategy")
        self.hub_strategy = to_enum(HubStrategy, self.hub_strategy, "hub_strategy")
        self.lr_scheduler_type = to_enum(SchedulerType, self.lr_scheduler_type, "lr_scheduler_type")
        self.optim = to_enum(OptimizerNames, self.optim, "optim")
        if isinstance(self.debug, str):
            self.debug = [to_enum(DebugOption, word, "debug") for word in self.debug.split()]
        elif self.debug is None:
            self.debug = []

        # 4. Derived values.
        if self.do_eval is False and self.eval_strategy != IntervalStrategy.NO:
            self.do_eval = True
        check_eval_steps_available(self)  # V12; eval_steps falls back to logging_steps
        if (
            self.load_best_model_at_end
            or self.lr_scheduler_type in (SchedulerType.REDUCE_ON_PLATEAU, SchedulerType.GREEDY)
        ) and self.metric_for_best_model is None:
            self.metric_for_best_model = "loss"
        if self.greater_is_better is None and self.metric_for_best_model is not None:
            self.greater_is_better = not self.metric_for_best_model.endswith("loss")

        if self.report_to == "all" or self.report_to == ["all"]:
            self.report_to = _available_reporting_integrations()
            # What "all" became: where Lightning's loggers carry report_to, the names they have no logger for
            # are left out of such a list instead of refused (translation/logger_specs.py).
            self._report_to_expanded_from_all = list(self.report_to)
        elif self.report_to == "none" or self.report_to == ["none"]:
            self.report_to = []
        elif not isinstance(self.report_to, list):
            self.report_to = [self.report_to]
        if _kubeflow_enabled() and "kubeflow" not in self.report_to:
            self.report_to = list(self.report_to) + ["kubeflow"]

        # 5. Validation (V1-V11).
        validate_arguments(self)

        # 6. Precision and compilation.
        self.mixed_precision = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
        if self.fp16:
            self.mixed_precision = "fp16"
        elif self.bf16:
            self.mixed_precision = "bf16"
        if (
            self.torch_compile_mode is not None or self.torch_compile_backend is not None
        ) and not self.torch_compile:
            self.torch_compile = True
        if self.torch_compile and self.torch_compile_backend is None:
            # The reference picks "hpu_backend" / "neuron" on those devices; Lightning supports neither.
            self.torch_compile_backend = "inductor"

        # 7. accelerator_config. The reference pops `use_configured_state` when it sets up the devices (from
        # its __post_init__), so its to_dict() lacks the key afterwards; we pop it here for the same serialisation.
        # True asks for the process state already configured instead of a new one: ours is always the launcher's
        # (no accelerate state is made), so both values mean the same here (docs/divergences.md).
        self.accelerator_config = to_accelerator_config(self.accelerator_config)
        self.accelerator_config.pop("use_configured_state", False)

        # 8. TF32 (V14), as the reference: forced on for torch_compile when available, else per `tf32`.
        if self.torch_compile or self.tf32 is not None:
            tf32_available = check_tf32_supported(self)
            if self.torch_compile and tf32_available and ((self.tf32 is None and not self.fp16) or self.bf16):
                _apply_tf32(True)
            elif self.torch_compile and not tf32_available:
                logger.warning(
                    "The speedups for torchdynamo mostly come with GPU Ampere or higher and which is not detected here."
                )
            if self.tf32 is not None and tf32_available:
                _apply_tf32(bool(self.tf32))

        # 9. Hardware overrides.
        if self.use_cpu:
            self.dataloader_pin_memory = False
        if (
            self.dataloader_multiprocessing_context is None
            and self.dataloader_num_workers > 1
            and mps_available()
        ):
            self.dataloader_multiprocessing_context = "fork"

        # 10. FSDP (V15) and DeepSpeed (V16), last as in the reference.
        self.fsdp_plugin_args = process_fsdp_args(self)
        self.hf_deepspeed_config: dict[str, Any] | None = None
        self.deepspeed_mismatches: list[str] = []
        if self.deepspeed:
            # The field keeps the user's value; the resolved copy lives in hf_deepspeed_config.
            config = load_deepspeed_config(self.deepspeed)
            self.deepspeed_mismatches = deepspeed_fill_at_construction(config, self)
            self.hf_deepspeed_config = config
        # The reference's attribute, None without DeepSpeed: TRL's trainers read it whenever a peft_config is given.
        self.deepspeed_plugin = DeepSpeedPluginView(self.hf_deepspeed_config) if self.hf_deepspeed_config else None

    # ----------------------------------------------------------------- serialisation

    def __str__(self) -> str:
        self_as_dict = {k: f"<{k.upper()}>" if k.endswith("_token") else v for k, v in asdict(self).items()}
        attrs_as_str = [f"{k}={v},\n" for k, v in sorted(self_as_dict.items())]
        return f"{self.__class__.__name__}(\n{''.join(attrs_as_str)})"

    __repr__ = __str__

    def to_dict(self) -> dict[str, Any]:
        """One JSON-friendly entry per init field: enums as values, every ``*_token`` redacted."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        for key, value in d.items():
            if isinstance(value, Enum):
                d[key] = value.value
            elif isinstance(value, list) and value and isinstance(value[0], Enum):
                d[key] = [x.value for x in value]
            elif isinstance(value, AcceleratorConfig):
                d[key] = value.to_dict()
            elif key == "parallelism_config" and value is not None:
                d[key] = value.to_json()
            elif isinstance(value, (dict, list)):
                d[key] = copy.deepcopy(value)  # so the dtype conversion below never edits our own values
            if key.endswith("_token"):
                d[key] = f"<{key.upper()}>"
        _dict_dtype_to_str(d)
        return d

    def to_json_string(self) -> str:
        """``to_dict()`` as indented JSON."""
        return json.dumps(self.to_dict(), indent=2)

    def to_sanitized_dict(self) -> dict[str, Any]:
        """``to_dict()`` plus batch sizes, with every non-scalar value turned into ``str`` (TensorBoard hparams)."""
        d = {
            **self.to_dict(),
            "train_batch_size": self.train_batch_size,
            "eval_batch_size": self.eval_batch_size,
        }
        valid_types: list[type] = [bool, int, float, str]
        if "torch" in sys.modules:
            valid_types.append(sys.modules["torch"].Tensor)
        return {k: v if type(v) in valid_types else str(v) for k, v in d.items()}

    # ----------------------------------------------------------------- derived values

    @property
    def train_batch_size(self) -> int:
        """Batch size per forward: ``per_device_train_batch_size * max(1, n_gpu)``."""
        return self.per_device_train_batch_size * max(1, self.n_gpu)

    @property
    def eval_batch_size(self) -> int:
        """Batch size per eval forward: ``per_device_eval_batch_size * max(1, n_gpu)``."""
        return self.per_device_eval_batch_size * max(1, self.n_gpu)

    @property
    def place_model_on_device(self) -> bool | None:
        """Hook for subclasses; ``None`` lets the trainer decide."""
        return None

    @property
    def _no_sync_in_gradient_accumulation(self) -> bool:
        return not self.deepspeed

    def get_warmup_steps(self, num_training_steps: int) -> int:
        """Warmup steps: ``int(warmup_steps)`` if >= 1, else ``ceil(num_training_steps * warmup_steps)``.

        The v4 ``warmup_ratio=1.0`` (kept on the ``warmup_ratio`` attribute) warms up for the whole run.
        """
        if self.warmup_steps == 0 and self.warmup_ratio == 1:
            return num_training_steps
        if self.warmup_steps >= 1:
            return int(self.warmup_steps)
        return math.ceil(num_training_steps * self.warmup_steps)


def _dict_dtype_to_str(d: dict[str, Any]) -> None:
    """Turn any nested ``"dtype"`` torch dtype into its short name (``torch.float16`` → ``"float16"``)."""
    if d.get("dtype") is not None and not isinstance(d["dtype"], str):
        d["dtype"] = str(d["dtype"]).split(".")[1]
    for value in d.values():
        if isinstance(value, dict):
            _dict_dtype_to_str(value)


@with_v4_aliases
@dataclass(repr=False)  # keep the redacting __repr__ (the reference's Seq2Seq repr shows hub_token)
class Seq2SeqTrainingArguments(TrainingArguments):
    """``TrainingArguments`` plus the reference's five generation fields."""

    sortish_sampler: bool = field(default=False, metadata={"help": "Whether to use SortishSampler or not."})
    predict_with_generate: bool = field(
        default=False,
        metadata={"help": "Whether to use generate to calculate generative metrics (ROUGE, BLEU)."},
    )
    generation_max_length: int | None = field(
        default=None,
        metadata={
            "help": (
                "The `max_length` to use on each evaluation loop when `predict_with_generate=True`. Will default "
                "to the `max_length` value of the model configuration."
            )
        },
    )
    generation_num_beams: int | None = field(
        default=None,
        metadata={
            "help": (
                "The `num_beams` to use on each evaluation loop when `predict_with_generate=True`. Will default "
                "to the `num_beams` value of the model configuration."
            )
        },
    )
    generation_config: str | Path | Any | None = field(
        default=None,
        metadata={
            "help": "Model id, file path or url pointing to a GenerationConfig json file, to use during prediction."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sortish_sampler:
            warnings.warn(
                "`sortish_sampler=True` has no effect (it has none in transformers 5.24 either); use "
                '`train_sampling_strategy="group_by_length"` for length-aware batching.',
                UserWarning,
                stacklevel=4,
            )

    def to_dict(self) -> dict[str, Any]:
        """As ``TrainingArguments.to_dict``, with a ``GenerationConfig`` object turned into its dict."""
        d = super().to_dict()
        value = d.get("generation_config")
        if value is not None and not isinstance(value, (str, dict, os.PathLike)):
            to_dict = getattr(value, "to_dict", None)
            if callable(to_dict):
                d["generation_config"] = to_dict()
        return d


def _is_transformers_args(obj: Any) -> bool:
    return any(
        cls.__name__ == "TrainingArguments" and cls.__module__.startswith("transformers")
        for cls in type(obj).__mro__
    )


def _is_seq2seq(obj: Any) -> bool:
    return any(cls.__name__ == "Seq2SeqTrainingArguments" for cls in type(obj).__mro__)


def _plain_value(name: str, value: Any) -> Any:
    """A transformers field value in the form our constructor takes (enums → values, configs → dicts)."""
    if name == "debug" and isinstance(value, list):
        return " ".join(str(v) for v in enum_value(value))
    if name == "accelerator_config" and value is not None and not isinstance(value, (dict, str)):
        return dict(value.to_dict())
    return enum_value(value)


def as_training_arguments(obj: Any) -> TrainingArguments:
    """Our arguments from ours (returned as is), a transformers ``TrainingArguments`` / Seq2Seq, or a dict.

    A transformers object is read field by field with ``getattr`` (not ``to_dict()``, which redacts
    ``hub_token``); a Seq2Seq source gives our ``Seq2SeqTrainingArguments``. In a dict, ``*_token``
    placeholders written by ``to_dict()`` (``"<HUB_TOKEN>"``) count as no token.
    """
    if isinstance(obj, TrainingArguments):
        return obj
    if isinstance(obj, dict):
        values = {k: (None if k.endswith("_token") and v == f"<{k.upper()}>" else v) for k, v in obj.items()}
        seq2seq = any(name in values for name in (*_SEQ2SEQ_FIELDS, "generation_config"))
        cls = Seq2SeqTrainingArguments if seq2seq else TrainingArguments
        return cls(**values)
    if _is_transformers_args(obj):
        cls = Seq2SeqTrainingArguments if _is_seq2seq(obj) else TrainingArguments
        return fields_into(obj, cls, "as_training_arguments", stacklevel=3)
    raise ValueError(
        f"args: expected hf_lightning or transformers TrainingArguments, or a dict; got {type(obj).__name__}. "
        "Build the arguments with hf_lightning.TrainingArguments(...)."
    )


def fields_into(obj: Any, cls: type, who: str, leave_out: frozenset[str] = frozenset(), stacklevel: int = 2) -> Any:
    """``cls`` built from a transformers-style arguments object's values, read field by field with ``getattr``.

    Fields ``obj`` has and ``cls`` lacks are named in a ``UserWarning`` (prefixed ``who``) and ignored; fields in
    ``leave_out`` are left to ``cls``'s defaults (values its ``__post_init__`` derives from others)."""
    ours = {f.name for f in fields(cls)}
    theirs = {f.name for f in fields(obj)} if hasattr(obj, "__dataclass_fields__") else set()
    dropped = sorted(theirs - ours)
    if dropped:
        warnings.warn(
            f"{who}: {type(obj).__name__} fields {dropped} have no hf_lightning equivalent and are ignored.",
            UserWarning,
            stacklevel=stacklevel,
        )
    values = {
        f.name: _plain_value(f.name, getattr(obj, f.name))
        for f in fields(cls)
        if f.init and f.name not in leave_out and hasattr(obj, f.name)
    }
    return cls(**values)
