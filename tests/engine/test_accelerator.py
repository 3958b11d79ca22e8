"""`trainer.accelerator` in one process, against accelerate's own `Accelerator` (the reference trainer's).

The same calls are made on both (tests/distributed/accelerator_script.py: process facts, collectives, a prepared
DataLoader, models, and from a `compute_loss` override during training and evaluation, as TRL's trainers do)
and must give the same results, except for the divergences listed in docs/divergences.md, pinned here.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.distributed.accelerator_script import (
    ACCUMULATION,
    BATCH_SIZE,
    NUM_TRAIN,
    report,
    reset_reference_state,
)
from tests.models import make_regression_mlp, regression_data
from tests.no_transformers import BLOCK_TRANSFORMERS

ROOT = Path(__file__).resolve().parents[2]

# What accelerate reports after train() returns: its finished train loader is still registered, so a
# gather_for_metrics outside any loop is cut to that loader's remainder (docs/divergences.md).
AFTER_TRAIN = ("gather_for_metrics_after_train",)
AFTER_TRAIN_FACTS = ("end_of_dataloader", "remainder")

# What TRL 1.16's trainers read of `self.accelerator` (decisions: the surface TRL needs).
TRL_SURFACE = (
    "gather_for_metrics", "gather", "num_processes", "parallelism_config", "unwrap_model", "prepare_model",
    "autocast", "device", "is_main_process", "wait_for_everyone", "process_index", "is_local_main_process",
    "local_process_index", "reduce", "print", "prepare", "state", "sync_gradients", "split_between_processes",
    "pad_across_processes", "mixed_precision", "dataloader_config", "backward",
)  # fmt: skip


def _without(result: dict, keys: tuple[str, ...]) -> dict:
    result = {key: value for key, value in result.items() if key not in keys}
    result["facts_after"] = {k: v for k, v in result["facts_after"].items() if k not in AFTER_TRAIN_FACTS}
    return result


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, dict]]:
    """Per precision, what each side's accelerator returned (reference first, then ours)."""
    results: dict[str, dict[str, dict]] = {}
    for name, arguments in {"fp32": {}, "bf16": {"bf16": True}}.items():
        out_dir = str(tmp_path_factory.mktemp(f"accelerator_{name}"))
        results[name] = {side: report(side, out_dir, **arguments) for side in ("reference", "ours")}
    reset_reference_state()
    return results


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_same_calls_give_accelerates_results(reports, precision):
    reference, ours = reports[precision]["reference"], reports[precision]["ours"]
    assert _without(ours, AFTER_TRAIN) == _without(reference, AFTER_TRAIN)
    # The comparison covers what it should: a whole run of records, one per micro-batch and eval batch.
    steps_per_epoch = -(-NUM_TRAIN // BATCH_SIZE)
    training = [record for record in ours["train_records"] if record["training"]]
    assert len(training) == 2 * steps_per_epoch
    assert ours["facts_before"]["mixed_precision"] == ("bf16" if precision == "bf16" else "no")
    assert ours["models"]["autocast_dtype"] == ("torch.bfloat16" if precision == "bf16" else "torch.float32")


def test_gather_for_metrics_cuts_the_last_batch_like_accelerate(reports):
    """In one process the last batch holds 11 % 2 = 1 real sample: from the window that draws it (the whole
    window, as accelerate's prepared loader reports its end once the last batch is fetched) every gather is cut
    to 1 row, in training and evaluation alike; the other batches are whole."""
    ours = reports["fp32"]["ours"]
    training = [record for record in ours["train_records"] if record["training"]]
    steps_per_epoch = -(-NUM_TRAIN // BATCH_SIZE)
    last_window = steps_per_epoch - (steps_per_epoch % ACCUMULATION or ACCUMULATION)
    for index, record in enumerate(training):
        at_end = index % steps_per_epoch >= last_window
        assert record["end_of_dataloader"] is at_end and record["remainder"] == NUM_TRAIN % BATCH_SIZE
        assert len(record["labels"][1]) == (1 if at_end else BATCH_SIZE)
        assert len(record["repeated"][1]) == (1 if at_end else 3 * BATCH_SIZE)
    evaluation = [record for record in ours["eval_records"] if not record["training"]]
    assert [len(record["labels"][1]) for record in evaluation] == [2, 2, 1]
    assert [record["end_of_dataloader"] for record in evaluation] == [False, False, True]
    loader = ours["prepared_loader"]
    assert [row["gathered"][1] for row in loader[:-1]] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0]]
    assert loader[-1] == {"after": False, "length": 4}


def test_after_train_gather_for_metrics_is_not_cut_by_a_finished_loader(reports):
    """Divergence: accelerate keeps the finished train loader registered after train(), so a gather outside any
    loop is cut to its remainder (1 of 3 rows here); ours is a plain gather there."""
    reference, ours = reports["fp32"]["reference"], reports["fp32"]["ours"]
    assert reference["gather_for_metrics_after_train"] == ("float32", [0.0])
    assert (reference["facts_after"]["end_of_dataloader"], reference["facts_after"]["remainder"]) == (True, 1)
    assert ours["gather_for_metrics_after_train"] == ("float32", [0.0, 1.0, 2.0])
    assert (ours["facts_after"]["end_of_dataloader"], ours["facts_after"]["remainder"]) == (False, -1)


def _trainer(tmp_path, **arguments):
    from hf_lightning import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", disable_tqdm=True, **arguments
    )
    return Trainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(8))


def test_trl_surface_exists_from_construction(tmp_path):
    accelerator = _trainer(tmp_path).accelerator
    missing = [name for name in TRL_SURFACE if not hasattr(accelerator, name)]
    assert missing == []
    assert accelerator.device == torch.device("cpu") and accelerator.num_processes == 1
    assert accelerator.parallelism_config is None and accelerator.is_main_process


def test_object_collectives_are_methods_here_and_functions_in_accelerate():
    """Divergence: accelerate has `gather_object`, `broadcast` and `broadcast_object_list` in accelerate.utils
    only; ours are also methods (their results are compared with accelerate.utils' in the battery)."""
    import accelerate

    from hf_lightning.engine.accelerator import LightningAccelerator

    for name in ("gather_object", "broadcast", "broadcast_object_list"):
        assert not hasattr(accelerate.Accelerator, name) and hasattr(accelerate.utils, name)
        assert callable(getattr(LightningAccelerator, name))


def test_every_public_accelerate_name_is_there_or_says_what_to_use(tmp_path):
    import accelerate

    accelerator = _trainer(tmp_path).accelerator
    unexplained = []
    for name in sorted(n for n in dir(accelerate.Accelerator) if not n.startswith("_")):
        if name in _RANKS_NEEDING_A_PARALLELISM_CONFIG:
            continue  # RuntimeError without parallelism_config, as in accelerate (the test below)
        try:
            getattr(accelerator, name)
        except AttributeError as error:
            if "no meaning under hf_lightning" not in str(error) and "not supported" not in str(error):
                unexplained.append(name)
    assert unexplained == []


_RANKS_NEEDING_A_PARALLELISM_CONFIG = ("data_parallel_rank", "data_parallel_shard_rank", "tensor_parallel_rank")


def test_parallel_ranks_without_a_parallelism_config_raise_as_accelerates(tmp_path):
    import accelerate

    ours = _trainer(tmp_path).accelerator
    theirs = accelerate.Accelerator(cpu=True)
    for name in _RANKS_NEEDING_A_PARALLELISM_CONFIG:
        for accelerator in (ours, theirs):
            with pytest.raises(RuntimeError, match="Set `parallelism_config` first"):
                getattr(accelerator, name)
    assert ours.torch_device_mesh is None and theirs.torch_device_mesh is None


def test_parallel_ranks_with_a_parallelism_config_of_ones_are_zero(tmp_path):
    ours = _trainer(tmp_path, parallelism_config={"tp_size": 1, "dp_shard_size": 1}).accelerator
    assert [getattr(ours, name) for name in _RANKS_NEEDING_A_PARALLELISM_CONFIG] == [0, 0, 0]


@pytest.mark.parametrize(
    ("name", "instead"),
    [
        ("accumulate", "gradient_accumulation_steps"),
        ("save_state", "resume_from_checkpoint"),
        ("load_state", "resume_from_checkpoint"),
        ("init_trackers", "report_to"),
        ("prepare_optimizer", "optimizers="),
        ("skip_first_batches", "resume_from_checkpoint"),
        ("register_for_checkpointing", "TrainerCallback"),
    ],
)
def test_what_the_engine_owns_raises_naming_what_to_use(tmp_path, name, instead):
    accelerator = _trainer(tmp_path).accelerator
    with pytest.raises(AttributeError, match=instead):
        getattr(accelerator, name)
    assert not hasattr(accelerator, name)
    with pytest.raises(AttributeError, match="has no attribute 'not_an_accelerate_name'"):
        accelerator.not_an_accelerate_name  # noqa: B018


def test_preparing_what_lightning_prepares_raises_naming_what_to_use(tmp_path):
    trainer = _trainer(tmp_path)
    accelerator = trainer.accelerator
    with pytest.raises(ValueError, match="evaluation_mode=True"):
        accelerator.prepare_model(copy.deepcopy(trainer.model))
    with pytest.raises(ValueError, match="Trainer\\(model=...\\)"):
        accelerator.prepare(copy.deepcopy(trainer.model).train())
    optimizer = torch.optim.SGD(trainer.model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="optimizers="):
        accelerator.prepare(optimizer)
    with pytest.raises(ValueError, match="create_scheduler"):
        accelerator.prepare(torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0))
    with pytest.raises(AttributeError, match="accelerator_config"):
        accelerator.dataloader_config.split_batches = True
    accelerator.dataloader_config.dispatch_batches = False  # what TRL sets for iterable data: already so
    with pytest.raises(TypeError, match="gather_object"):
        accelerator.reduce(["not a tensor"])
    with pytest.raises(ValueError, match="reduction"):
        accelerator.reduce(torch.ones(1), reduction="product")
    frozen = copy.deepcopy(trainer.model).eval()
    assert accelerator.prepare(frozen) is frozen and frozen._is_accelerate_prepared


def test_backward_and_sync_gradients_inside_a_run(tmp_path):
    """A `training_step` override that calls `self.accelerator.backward` trains exactly as the built-in one."""
    from hf_lightning import Trainer, TrainingArguments

    class AcceleratorBackward(Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            self.seen_sync.append(self.accelerator.sync_gradients)
            loss = self.compute_loss(model, inputs) / self.current_gradient_accumulation_steps
            self.accelerator.backward(loss)
            return loss.detach()

    def train(trainer_cls):
        args = TrainingArguments(
            output_dir=str(tmp_path), use_cpu=True, report_to="none", disable_tqdm=True, seed=1,
            per_device_train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=1, save_strategy="no",
        )  # fmt: skip
        trainer = trainer_cls(model=make_regression_mlp(), args=args, train_dataset=regression_data(8))
        trainer.seen_sync = []
        trainer.train()
        return trainer

    ours, builtin = train(AcceleratorBackward), train(Trainer)
    assert ours.seen_sync == [False, True, False, True]
    for mine, theirs in zip(ours.model.parameters(), builtin.model.parameters()):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-7)


def test_no_sync_and_unwrap_keep_fp32_wrapper(tmp_path):
    accelerator = _trainer(tmp_path, bf16=True).accelerator
    model = nn.Linear(2, 2)
    with accelerator.no_sync(model):  # a module without no_sync: nothing to suspend
        pass
    prepared = accelerator.prepare_model(copy.deepcopy(model).eval(), evaluation_mode=True)
    assert prepared(torch.ones(1, 2)).dtype == torch.float32
    unwrapped = accelerator.unwrap_model(prepared, keep_fp32_wrapper=False)
    assert "forward" not in vars(unwrapped) and unwrapped(torch.ones(1, 2)).dtype == torch.float32


def test_no_accelerate_needed_at_run_time(tmp_path):
    """With transformers and accelerate unimportable, a subclass's accelerator calls still work."""
    code = (
        BLOCK_TRANSFORMERS
        + f"""
import torch
from hf_lightning import Trainer, TrainingArguments
from tests.models import make_regression_mlp, regression_data

class Probe(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.gathered = self.accelerator.gather_for_metrics(inputs["labels"])
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

args = TrainingArguments(output_dir={str(tmp_path)!r}, use_cpu=True, report_to="none", max_steps=2,
                         disable_tqdm=True, save_strategy="no")
trainer = Probe(model=make_regression_mlp(), args=args, train_dataset=regression_data(8))
trainer.train()
assert trainer.gathered.shape == (8,) and trainer.accelerator.num_processes == 1
import sys
assert "accelerate" not in sys.modules and "transformers" not in sys.modules
print("ok")
"""
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


# ---- the transformers tests that exercise trainer.accelerator through the public trainer -------------------
@pytest.mark.parametrize("side", ["reference", "ours"])
def test_flos_extraction(tmp_path, side):
    """transformers' `test_flos_extraction`: unwrap_model sees through DataParallel; total_flos is a float."""
    from tests.distributed.accelerator_script import trainer_classes

    trainer_cls, args_cls = trainer_classes(side)
    from transformers import PretrainedConfig, PreTrainedModel

    class RegressionConfig(PretrainedConfig):
        model_type = "regression_for_flos"

    class RegressionPreTrainedModel(PreTrainedModel):
        config_class = RegressionConfig

        def __init__(self, config):
            super().__init__(config)
            self.a = nn.Parameter(torch.tensor(1.5))
            self.post_init()

        def forward(self, x, labels=None):
            y = x.sum(-1) * self.a
            return (nn.functional.mse_loss(y, labels), y) if labels is not None else (y,)

    model = RegressionPreTrainedModel(RegressionConfig())
    args = args_cls(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True
    )
    trainer = trainer_cls(model=model, args=args, train_dataset=regression_data(16))

    def assert_flos_extraction(wrapped):
        assert trainer.model is trainer.accelerator.unwrap_model(wrapped)
        assert getattr(trainer.accelerator.unwrap_model(wrapped).config, "total_flos", 0) >= 0

    assert_flos_extraction(trainer.model)
    assert_flos_extraction(nn.DataParallel(trainer.model))
    trainer.train()
    assert isinstance(trainer.state.total_flos, float)


@pytest.mark.parametrize("side", ["reference", "ours"])
def test_get_eval_dataloader_with_persistent_workers(tmp_path, side):
    """transformers' test: with `accelerator.prepare` mocked, persistent workers cache one loader per eval set."""
    from tests.distributed.accelerator_script import trainer_classes

    trainer_cls, args_cls = trainer_classes(side)
    args = args_cls(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", dataloader_persistent_workers=True,
        dataloader_num_workers=2,
    )  # fmt: skip
    train_dataset, eval_dataset = regression_data(8), regression_data(8, seed=1)
    trainer = trainer_cls(make_regression_mlp(), args, train_dataset=train_dataset, eval_dataset=eval_dataset)
    trainer.accelerator.prepare = lambda x: x  # the test's mock: an instance attribute replaces the method
    default_dataloader = trainer.get_eval_dataloader()
    dataloader_with_dataset = trainer.get_eval_dataloader(eval_dataset)
    assert default_dataloader.dataset is eval_dataset and dataloader_with_dataset.dataset is eval_dataset
    assert default_dataloader is dataloader_with_dataset

    first_dataset, second_dataset = regression_data(8, seed=2), regression_data(8, seed=3)
    trainer = trainer_cls(
        make_regression_mlp(), args, train_dataset=train_dataset,
        eval_dataset={"first": first_dataset, "second": second_dataset},
    )  # fmt: skip
    trainer.accelerator.prepare = lambda x: x
    first, first_again = trainer.get_eval_dataloader("first"), trainer.get_eval_dataloader("first")
    second, second_again = trainer.get_eval_dataloader("second"), trainer.get_eval_dataloader("second")
    assert first.dataset is first_dataset and second.dataset is second_dataset
    assert first is first_again and second is second_again and first is not second


def test_dealing_data_by_rank_is_refused_in_a_tensor_parallel_run(tmp_path, monkeypatch):
    """The tensor-parallel ranks are one replica: `prepare(dataloader)` and `split_between_processes` deal by global
    rank, which would feed each DTensor shard other samples, so they are refused naming the field (a one-process
    stand-in: the plan says tp_size=2 over 2 processes)."""
    import dataclasses

    import hf_lightning.engine.accelerator.dataloader as prepared
    import hf_lightning.engine.accelerator.state as run_state
    from hf_lightning.translation.plan import StrategyPlan

    trainer = _trainer(tmp_path)
    accelerator = trainer.accelerator
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2)
    monkeypatch.setattr(run_state, "num_processes", lambda trainer: 2)
    monkeypatch.setattr(prepared, "num_processes", lambda trainer: 2)
    # Data parallel over 2 processes: dealt, not refused.
    monkeypatch.setattr(trainer, "plan", dataclasses.replace(trainer.plan, strategy=None))
    with accelerator.split_between_processes(list(range(4))) as share:
        assert share == [0, 1]
    assert len(accelerator.prepare(loader)) == 2
    tp_strategy = StrategyPlan(name="tp", tensor_parallel_size=2)
    monkeypatch.setattr(trainer, "plan", dataclasses.replace(trainer.plan, strategy=tp_strategy))
    with pytest.raises(NotImplementedError, match=r"prepare\(dataloader\) with parallelism_config.tp_size=2"):
        accelerator.prepare(loader)
    with pytest.raises(NotImplementedError, match=r"split_between_processes with parallelism_config.tp_size=2"):
        with accelerator.split_between_processes(list(range(4))):
            pass


def test_even_batches_is_settable_as_accelerate_s_and_the_next_loaders_read_it(tmp_path, monkeypatch):
    """sentence-transformers sets `accelerator.even_batches` before preparing its loaders: the value reads back
    (accelerate's setter) and the loaders prepared from then on, the trainer's own included, deal by it."""
    import accelerate

    from hf_lightning.engine.accelerator import dataloader as prepared_module

    reference = accelerate.Accelerator(cpu=True)
    reference.even_batches = False
    trainer = _trainer(tmp_path)
    accelerator = trainer.accelerator
    assert accelerator.even_batches is True
    accelerator.even_batches = False
    assert accelerator.even_batches is reference.even_batches is False
    assert accelerator.dataloader_config.even_batches is False
    assert trainer._loader_settings().even_batches is False and trainer.plan.module.even_batches is True
    # Two processes: the prepared loader deals its batches with the value set.
    dealt = []
    monkeypatch.setattr(prepared_module, "num_processes", lambda trainer: 2)
    monkeypatch.setattr(prepared_module, "process_index", lambda trainer: 1)
    monkeypatch.setattr(
        prepared_module, "shard_batches", lambda batch_sampler, **options: dealt.append(options) or batch_sampler
    )
    accelerator.prepare(torch.utils.data.DataLoader(list(range(5)), batch_size=2))
    assert dealt[-1]["even_batches"] is False
    accelerator.even_batches = True
    accelerator.prepare(torch.utils.data.DataLoader(list(range(5)), batch_size=2))
    assert dealt[-1]["even_batches"] is True
