"""`args.distributed_state` reports what the reference's (accelerate's `PartialState`) reports (TRL reads it)."""

from __future__ import annotations


def test_distributed_state_matches_the_reference_on_one_process(make_args):
    from hf_lightning import TrainingArguments

    ours, reference = make_args(cls=TrainingArguments).distributed_state, make_args().distributed_state
    assert ours.distributed_type == reference.distributed_type  # "NO", equal to accelerate's DistributedType.NO
    for name in ("num_processes", "process_index", "local_process_index", "device", "is_main_process",
                 "is_local_main_process"):
        assert getattr(ours, name) == getattr(reference, name), name
