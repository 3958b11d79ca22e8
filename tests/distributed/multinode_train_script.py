"""One process of a 2-node x 1-process run (CPU, gloo), started by one of two torchrun agents or as one of
two `srun` tasks (SLURM_* variables): train with hf_lightning (`ours`) or the reference (`ref`) and dump
this rank's view as JSON: log history, final weights, its node's checkpoint files, the node-scoped flags
(`should_log`, `should_save`, ...) and what `main_process_first(local=...)` let run at the same time.

Each node writes into its own folder (`node<N>/`), standing in for a node's local disk, so that
`save_on_each_node` and the per-rank RNG files can be seen node by node.
"""

from __future__ import annotations

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.models import make_tiny_gpt2, padded_lm_data  # noqa: E402

SCENARIOS = {
    # The defaults: logs on each node's main process, checkpoints on the global main process only.
    "defaults": {},
    # The opposite node scoping: every node saves, only the global main process logs.
    "each_node": {"save_on_each_node": True, "log_on_each_node": False},
}


def _node() -> int:
    """This process's node: torchrun's GROUP_RANK (rendezvous order), else srun's SLURM_NODEID."""
    return int(os.environ.get("GROUP_RANK", os.environ.get("SLURM_NODEID", "0")))


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def _probe_main_process_first(args, folder: str, local: bool) -> bool:
    """Whether the other process's body ran while this one waited or ran: with `local=True` both processes
    are their node's main process, so neither waits; with `local=False` rank 1 waits for rank 0's body."""
    import torch.distributed as dist

    os.makedirs(folder, exist_ok=True)
    marker = os.path.join(folder, f"{'local' if local else 'global'}_{{}}")
    if dist.is_initialized():  # the first probe runs before anything created the process group
        dist.barrier()
    with args.main_process_first(local=local, desc="probe"):
        rank = _rank()
        if local:
            if rank == 0:  # waits (bounded) for rank 1's body: it only comes if rank 1 is not held back
                deadline = time.monotonic() + 60
                while not os.path.exists(marker.format(1)) and time.monotonic() < deadline:
                    time.sleep(0.05)
                seen = os.path.exists(marker.format(1))
            else:
                open(marker.format(1), "w").close()
                seen = True
        elif rank == 0:
            time.sleep(1.0)  # rank 1, if it were not held back, would look before this marker exists
            open(marker.format(0), "w").close()
            seen = True
        else:
            seen = os.path.exists(marker.format(0))
    dist.barrier()
    return seen


def _listing(path: str) -> dict:
    folders = {}
    if os.path.isdir(path):
        for folder in sorted(os.listdir(path)):
            if folder.startswith("checkpoint-"):
                folders[folder] = sorted(os.listdir(os.path.join(path, folder)))
    return folders


def main(side: str, out_dir: str, scenarios: list[str]) -> None:
    results = {}
    for name in scenarios or list(SCENARIOS):
        extra = SCENARIOS[name]
        kwargs = dict(
            output_dir=os.path.join(out_dir, side, name, f"node{_node()}"),
            use_cpu=True,
            report_to="none",
            disable_tqdm=True,
            per_device_train_batch_size=2,
            max_steps=2,
            logging_steps=1,
            learning_rate=1e-3,
            save_strategy="steps",
            save_steps=1,
            ddp_backend="gloo",
            **extra,
        )
        if side == "ref":
            import transformers

            trainer_cls, args = transformers.Trainer, transformers.TrainingArguments(**kwargs)
        else:
            from hf_lightning import Trainer, TrainingArguments

            trainer_cls, args = Trainer, TrainingArguments(**kwargs)
        trainer = trainer_cls(model=make_tiny_gpt2(), args=args, train_dataset=padded_lm_data(14))
        probes = os.path.join(out_dir, side, name, "probes")
        results[name] = {
            "layout": [args.world_size, args.process_index, args.local_process_index],
            "flags": {
                "should_log": args.should_log,
                "should_save": args.should_save,
                "log_level": args.get_process_log_level(),
                "is_local_process_zero": trainer.is_local_process_zero(),
                "is_world_process_zero": trainer.is_world_process_zero(),
            },
            "main_process_first": {
                "local": _probe_main_process_first(args, probes, local=True),
                "global": _probe_main_process_first(args, probes, local=False),
            },
        }
        trainer.train()
        import torch

        results[name].update(
            log_history=trainer.state.log_history,
            weights={
                key: value.detach().to(torch.float64).flatten().tolist()
                for key, value in trainer.model.state_dict().items()
            },
            checkpoints=_listing(args.output_dir),
        )
        if side == "ours":
            results[name]["cluster"] = type(trainer.lightning_trainer.strategy.cluster_environment).__name__
    with open(os.path.join(out_dir, f"{side}_{_rank()}.json"), "w") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    from tests.distributed.teardown import end_worker

    main(sys.argv[1], sys.argv[2], sys.argv[3:])
    end_worker()
