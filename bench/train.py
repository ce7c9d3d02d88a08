"""LoRA training overhead of the grid: the training worker run directly as a
process of its own vs the same steps as a `genome/train` job on a tower over
loopback RNS.

Both sides run the same worker code (reticulum_grid/training/trainer.py) on
the same base GGUF (SmolLM2-135M), dataset, LoRA settings, batch and sequence
length, and are timed the same way: from the per-step timestamps the worker
itself records (``elapsed_s`` in its step events), so model loading, RNS and
the client's event delivery are outside both figures. Seconds per step are
taken over the steps after WARMUP. Local runs and grid jobs alternate
(local, grid, local, grid, ...) for ``--pairs`` pairs, so a machine that gets
slower or faster meanwhile affects both sides alike.

Printed: each pair's s/step, the median ratio grid/local with its range, and
the median ratio of neighbouring local runs (local i / local i+1) with its
range: the noise floor. A train_step_ratio inside the noise floor's range is
no measurable overhead. Beside it, what a user waits for: the job's wall time
from submitting it (the dataset pushed, dispatch, the worker's start and model
load, every event) to its end event, against the local process's from start
to exit (``train_wall_ratio``).

Last line: ``train_step_ratio=<median grid s/step / local s/step>``. Goal (issue 4): <= 1.05.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from reticulum_grid.client import Grid
from reticulum_grid.inference.default_model import DEFAULT_ALIAS, default_model_path
from reticulum_grid.node import identity, rnsnet
from reticulum_grid.node.localgrid import TowerProcess, trust_local_towers
from reticulum_grid.training import trainer

DATA = Path(__file__).resolve().parent.parent / "testbed" / "data" / "secret.jsonl"
#: Steps left out of the timing on both sides (allocator and cache warm-up).
WARMUP = 3
SPEC = {"rank": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "learning_rate": 2e-4, "seq_len": 96, "batch_size": 4, "seed": 3, "checkpoint_every": 10_000}


def seconds_per_step(elapsed):
    """Mean seconds per step after WARMUP, from the worker's per-step ``elapsed_s`` list."""
    return (elapsed[-1] - elapsed[WARMUP - 1]) / (len(elapsed) - WARMUP)


def local_run(steps, job_dir):
    """The worker as a plain process (no tower, no RNS): its step timestamps."""
    job_dir.mkdir(parents=True)
    spec = {**SPEC, "max_steps": steps, "base_path": str(default_model_path()), "dataset_path": str(DATA),
            "output_alias": "bench-local"}
    (job_dir / trainer.SPEC).write_text(json.dumps(spec))
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "reticulum_grid.training.trainer", str(job_dir)], check=True,
                         capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall_s = time.perf_counter() - started
    events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return [e["elapsed_s"] for e in events if e.get("event") == "step"], wall_s


def grid_run(grid, entry, steps, k):
    """The same steps as a job on the tower: the step timestamps its worker
    recorded, and the seconds from submitting the job to its end event."""
    started = time.perf_counter()
    _, job_id = grid.train({"base": DEFAULT_ALIAS, "dataset": "", "output_alias": f"bench-lora-{k}",
                            "max_steps": steps, **SPEC}, data_path=DATA, tower=entry.name)
    elapsed = []
    for event in grid.watch(job_id, entry.name):
        if event["type"] == "progress":
            elapsed.append(event["elapsed_s"])
        elif event["type"] == "end":
            if event["state"] != "succeeded":
                raise SystemExit(f"job {job_id} ended {event['state']}: {event.get('error')}")
            break
    return elapsed, time.perf_counter() - started


def spread(values):
    return f"median {statistics.median(values):.3f} (range {min(values):.3f}-{max(values):.3f}, n={len(values)})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    assert args.steps > WARMUP + 1 and args.pairs >= 2
    local, remote, local_wall, remote_wall = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="rngrid-bench-train-") as tmp:
        tmp = Path(tmp)
        home = tmp / "client"
        client_id = identity.load_or_create(home / "identity").hash.hex()
        trust_local_towers(home)  # this client trusts the towers it starts
        tower = TowerProcess(tmp, "bench-trainer", {DEFAULT_ALIAS: default_model_path()},
                             allow={client_id: ["train", "sync"]}).start()
        try:
            grid = Grid(home=home, connect=[tower.address])
            entry = grid.find_tower("bench-trainer", timeout=120)
            for k in range(args.pairs):
                for steps, walls, (elapsed, wall_s) in ((local, local_wall, local_run(args.steps, tmp / f"local-{k}")),
                                                        (remote, remote_wall, grid_run(grid, entry, args.steps, k))):
                    steps.append(seconds_per_step(elapsed))
                    walls.append(wall_s)
                print(f"pair {k + 1}: local {local[-1]:.3f} s/step in {local_wall[-1]:.1f} s, grid {remote[-1]:.3f} "
                      f"s/step in {remote_wall[-1]:.1f} s from submit to end", flush=True)
            grid.close()
        finally:
            rnsnet.stop()
            tower.stop()
    ratios = [g / l for g, l in zip(remote, local)]
    floor = [a / b for a, b in zip(local, local[1:])]
    print(json.dumps({"steps": args.steps, "warmup": WARMUP, "pairs": args.pairs, **SPEC}))
    print(f"local s/step: {spread(local)}")
    print(f"grid s/step:  {spread(remote)}")
    print(f"noise floor (local i / local i+1): {spread(floor)}")
    print(f"grid/local per pair: {spread(ratios)}")
    print(f"wall s, local start to exit: {spread(local_wall)}; grid submit to end: {spread(remote_wall)}")
    print(f"train_wall_ratio={statistics.median(g / l for g, l in zip(remote_wall, local_wall)):.3f}")
    print(f"train_step_ratio={statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
