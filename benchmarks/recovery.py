"""Recovery time after a lost worker: from the kill to the first good step of the restarted job, ours against
transformers.Trainer, both under the literal `torchrun --nproc_per_node=2 --max-restarts=1` (gloo, CPU).

    python benchmarks/recovery.py                # 3 interleaved repeats per side
    python benchmarks/recovery.py --repeats 5

The script each side runs is the same plain one: build the trainer, call `train()` without `resume_from_checkpoint`
(what most scripts do), 24 updates of a small MLP, a checkpoint every 4; rank 1 of the first attempt kills itself
(SIGKILL) after update 10. Per run:
- `connected`: the restarted attempt trained (on gloo the reference's restarted workers often cannot connect:
  they read the dead attempt's rendezvous entries);
- `recovery_s`: from the kill to the end of the restarted attempt's first update (its start-up included);
- `steps_redone`: updates the restarted attempt ran again (ours continues from checkpoint-8: 2; the reference
  starts over: 10);
- `to_done_s`: from the kill to the end of the job.
A launch that fails (`returncode`) or runs past 180 s (hung; its process group is killed) did not connect.
Medians over the runs that connected; the success count beside them. One run at a time (2 processes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # run by torch.distributed.run as a script
    sys.path.insert(0, REPO)

MAX_STEPS, SAVE_STEPS, KILL_AFTER = 24, 4, 10
LAUNCH_TIMEOUT_S = 180  # a whole job takes well under a minute; a launch still running then has hung
SIDES = ("hf_lightning", "transformers")


def _worker(side: str, out_dir: str) -> None:
    """One rank of one attempt: train, writing each update's end time; rank 1 of attempt 0 dies after KILL_AFTER."""
    import torch
    from torch import nn
    from torch.utils.data import Dataset

    torch.set_num_threads(1)
    if side == "transformers":
        from transformers import Trainer, TrainerCallback, TrainingArguments
    else:
        from hf_lightning import Trainer, TrainingArguments
        from hf_lightning.callbacks import TrainerCallback

    attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
    events = os.path.join(out_dir, f"attempt{attempt}_rank{rank}.jsonl")

    class Rows(Dataset):
        def __init__(self) -> None:
            generator = torch.Generator().manual_seed(0)
            self.x, self.y = torch.randn(256, 32, generator=generator), torch.randn(256, generator=generator)

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, index: int) -> dict:
            return {"x": self.x[index], "labels": self.y[index]}

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))

        def forward(self, x, labels=None):
            return {"loss": nn.functional.mse_loss(self.net(x).squeeze(-1), labels)}

    class Record(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            with open(events, "a") as handle:
                handle.write(json.dumps({"step": state.global_step, "time": time.time()}) + "\n")
            if state.global_step == KILL_AFTER and rank == "1" and attempt == "0":
                with open(os.path.join(out_dir, "killed_at"), "w") as handle:
                    handle.write(str(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)

    args = TrainingArguments(
        output_dir=os.path.join(out_dir, "run"), use_cpu=True, report_to="none", disable_tqdm=True,
        max_steps=MAX_STEPS, save_steps=SAVE_STEPS, per_device_train_batch_size=8, ddp_backend="gloo",
    )  # fmt: skip
    Trainer(model=MLP(), args=args, train_dataset=Rows(), callbacks=[Record()]).train()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _one_run(side: str) -> dict:
    with tempfile.TemporaryDirectory() as out_dir:
        environment = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
        environment.update(OMP_NUM_THREADS="1", PYTHONPATH=REPO)
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--max-restarts=1",
            f"--master_port={_free_port()}", os.path.abspath(__file__), "--worker", side, out_dir,
        ]  # fmt: skip
        started = time.time()
        # A session of its own, so a launch that hangs (the reference's restart may) is ended with its workers.
        log = open(os.path.join(out_dir, "launch.log"), "w")  # noqa: SIM115 - closed below, after the launch
        process = subprocess.Popen(command, env=environment, stdout=log, stderr=log, start_new_session=True)
        try:
            returncode = process.wait(timeout=LAUNCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            returncode = None  # hung
        ended = time.time()
        log.close()
        restarted = os.path.join(out_dir, "attempt1_rank0.jsonl")
        if returncode != 0 or not os.path.exists(restarted):
            with open(os.path.join(out_dir, "launch.log")) as handle:
                errors = [line.strip() for line in handle if "Error" in line or "terminate called" in line]
            return {"connected": False, "returncode": returncode, "wall_s": ended - started, "why": errors[-3:]}
        with open(os.path.join(out_dir, "killed_at")) as handle:
            killed_at = float(handle.read())
        with open(restarted) as handle:
            steps = [json.loads(line) for line in handle]
        return {
            "connected": True,
            "recovery_s": steps[0]["time"] - killed_at,
            "steps_redone": KILL_AFTER - (steps[0]["step"] - 1),
            "to_done_s": steps[-1]["time"] - killed_at,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the runs and medians as JSON here")
    options = parser.parse_args()
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for repeat in range(options.repeats):
        for side in SIDES:  # interleaved: A B A B ...
            result = _one_run(side)
            runs[side].append(result)
            print(f"[{repeat + 1}/{options.repeats}] {side}: {result}", flush=True)
    summary = {}
    for side, results in runs.items():
        good = [result for result in results if result["connected"]]
        summary[side] = {"connected": f"{len(good)}/{len(results)}"}
        for key in ("recovery_s", "steps_redone", "to_done_s"):
            if good:
                summary[side][key] = statistics.median(result[key] for result in good)
    print(json.dumps(summary, indent=2))
    ours, theirs = summary["hf_lightning"], summary["transformers"]
    if "to_done_s" in ours and "to_done_s" in theirs:
        print(f"kill -> job done, ours / reference: {ours['to_done_s'] / theirs['to_done_s']:.2f}")
    if options.out:
        with open(options.out, "w") as handle:
            json.dump({"runs": runs, "summary": summary}, handle, indent=2)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], sys.argv[3])
    else:
        main()
