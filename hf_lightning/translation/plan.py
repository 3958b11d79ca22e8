"""The typed `Plan` that `translate` returns and the engine reads: frozen dataclasses, no behaviour.

Every field here is filled by a registry handler (or the base Lightning settings) and read by code
outside `hf_lightning.translation`; `tests/translation/test_plan_is_read.py` checks both, so a
setting cannot be reported honoured and then ignored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

HONOURED = "honoured"
REFUSED = "refused"
WARNED = "warned"
NOT_APPLICABLE = "not-applicable"
STATUSES = (HONOURED, REFUSED, WARNED, NOT_APPLICABLE)


@dataclass(frozen=True)
class FieldNote:
    """How one argument is carried out: `status` is honoured / refused / warned / not-applicable."""

    field: str
    value: Any
    status: str
    how: str


@dataclass(frozen=True)
class ModuleSettings:
    """What the engine (module, step methods, training run, data layer) carries out itself.

    The defaults are the arguments' defaults, for duck-typed arguments that lack a field.
    """

    # Micro-batches per update: gradient_accumulation_steps, or accelerator_config's num_steps when it is 1.
    gradient_accumulation_steps: int = 1
    # "bf16" | "fp16": the dtype the model's forward autocasts to (not the whole step); None: full precision.
    forward_autocast: str | None = None
    max_grad_norm: float | None = 1.0
    label_smoothing_factor: float = 0.0
    average_tokens_across_devices: bool = True
    include_num_input_tokens_seen: str = "no"
    activation_checkpointing: bool = False
    activation_checkpointing_kwargs: Mapping[str, Any] | None = None
    torch_compile: bool = False
    torch_compile_backend: str | None = None
    torch_compile_mode: str | None = None
    neftune_noise_alpha: float | None = None
    torch_empty_cache_steps: int | None = None
    # accelerator_config: batch sharding, sampler seeding and gradient sync under accumulation.
    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = True
    sync_each_batch: bool = False


@dataclass(frozen=True)
class EvaluationSettings:
    """What `evaluate()` / `predict()` read (evaluation/): the reference's defaults for arguments lacking a field."""

    on_start: bool = False  # eval_on_start
    prediction_loss_only: bool = False
    accumulation_steps: int | None = None  # eval_accumulation_steps
    do_concat_batches: bool = True  # eval_do_concat_batches
    use_gather_object: bool = False  # eval_use_gather_object
    batch_eval_metrics: bool = False
    include_for_metrics: tuple[str, ...] = ()
    fp16_full_eval: bool = False
    bf16_full_eval: bool = False


@dataclass(frozen=True)
class CheckpointSettings:
    """What the checkpoint saves, the best model and the resume read (checkpoint/)."""

    save_strategy: str = "steps"
    save_total_limit: int | None = None
    save_only_model: bool = False
    metric_for_best_model: str | None = None
    greater_is_better: bool | None = None
    load_best_model_at_end: bool = False
    restore_callback_states_from_checkpoint: bool = False
    ignore_data_skip: bool = False


@dataclass(frozen=True)
class LoggingSettings:
    """What the run's logging reads: the loss filter, the Lightning loggers' specs and the names the reference's
    integration callbacks carry (translation/logger_specs.py)."""

    nan_inf_filter: bool = True  # logging_nan_inf_filter
    loggers: tuple[Mapping[str, Any], ...] = ()
    # report_to names carried by the reference's own integration callbacks (integrations/reporting_callbacks.py).
    integrations: tuple[str, ...] = ()


@dataclass(frozen=True)
class HubSettings:
    """What the Hub pushes read (trainer/hub_methods.py). The token is not carried: it stays on the arguments, so
    no plan, note or `explain()` holds it."""

    push_to_hub: bool = False
    model_id: str | None = None  # hub_model_id
    strategy: str = "every_save"  # hub_strategy
    private_repo: bool | None = None  # hub_private_repo
    always_push: bool = False  # hub_always_push
    revision: str | None = None  # hub_revision


@dataclass(frozen=True)
class FSDPDetails:
    """An FSDP run: the arguments accelerate's FSDP plugin would receive, and values read from them."""

    version: int  # 1: FSDPStrategy wrapper, 2: fully_shard
    plugin_args: Mapping[str, Any]
    state_dict_type: str  # FULL_STATE_DICT or SHARDED_STATE_DICT: what checkpoints hold


@dataclass(frozen=True)
class DeepSpeedDetails:
    """A DeepSpeed run: the resolved config and what it disagrees on with the arguments."""

    config: Mapping[str, Any]
    mismatches: tuple[str, ...] = ()  # raised at train() once the train-start values are known
    zero_stage: int = -1  # zero_optimization.stage, -1 when unset


@dataclass(frozen=True)
class StrategyPlan:
    """The multi-process strategy: name, process-group options, DDP options set explicitly, details."""

    name: str  # "ddp" | "fsdp" | "fsdp2" | "deepspeed" | "tp"
    process_group_backend: str | None = None
    timeout: timedelta | None = None
    # DDP only; None: not passed (find_unused_parameters None: resolved with the model).
    find_unused_parameters: bool | None = None
    bucket_cap_mb: int | None = None
    broadcast_buffers: bool | None = None
    static_graph: bool | None = None
    fsdp: FSDPDetails | None = None
    deepspeed: DeepSpeedDetails | None = None
    # "tp" only: parallelism_config.tp_size, the mesh's tensor_parallel dimension (translation/parallelism.py).
    tensor_parallel_size: int = 1


@dataclass(frozen=True)
class LightningKwargs:
    """What `lightning.Trainer` receives (before the run's step bounds, loggers and strategy object)."""

    accelerator: str = "cpu"
    devices: int = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "32-true"
    max_steps: int = -1  # resolved at train start
    max_epochs: int = -1  # the run stops by update count, never by Lightning's epoch count
    # Manual optimization: accumulation and clipping are module settings.
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = None
    deterministic: bool | None = None
    benchmark: bool | None = None
    use_distributed_sampler: bool = False
    enable_checkpointing: bool = False
    enable_progress_bar: bool = False
    enable_model_summary: bool = False
    num_sanity_val_steps: int = 0
    limit_val_batches: int = 0
    logger: bool = False
    log_every_n_steps: int = 1  # irrelevant: the facade decides when to log
    inference_mode: bool = True
    default_root_dir: str = "trainer_output"

    def as_kwargs(self) -> dict[str, Any]:
        """The keyword arguments for `lightning.Trainer`, one per field."""
        return {item.name: getattr(self, item.name) for item in dataclasses.fields(self)}


@dataclass(frozen=True)
class Plan:
    """Everything the facade needs to build `lightning.Trainer` and `HFLightningModule`.

    `lightning.as_kwargs()` is accepted by `lightning.Trainer` as is; when `strategy` is not None the
    facade passes `strategy=build_strategy(plan, model)` instead of the name it holds, and
    `logger=build_loggers(plan)` when `logging.loggers` is not empty. Logger specs are the plain dicts
    `hf_lightning.translation.logger_specs.logger_specs` makes. Each section is filled once, here, and read by its
    component: `module` (training), `strategy`, `evaluation`, `checkpointing`, `logging`, `hub`.
    """

    module: ModuleSettings  # the training section: what the HFLightningModule and the step carry out
    strategy: StrategyPlan | None
    lightning: LightningKwargs
    evaluation: EvaluationSettings = field(default_factory=EvaluationSettings)
    checkpointing: CheckpointSettings = field(default_factory=CheckpointSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    hub: HubSettings = field(default_factory=HubSettings)
    notes: dict[str, FieldNote] = field(default_factory=dict)

    def refusals(self) -> list[FieldNote]:
        """The notes of refused fields (empty unless translated with `raise_on_refusal=False`)."""
        return [note for note in self.notes.values() if note.status == REFUSED]

    def warnings(self) -> list[str]:
        """Messages the trainer shows once, for fields accepted with a warning."""
        return [
            f"{note.field}={note.value!r}: {note.how}"
            for note in self.notes.values()
            if note.status == WARNED
        ]
