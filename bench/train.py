"""LoRA training overhead of the grid: a plain local peft loop vs the same
steps as a `genome/train` job on a tower over loopback RNS.

Same base GGUF (SmolLM2-135M), dataset, LoRA settings, batch and sequence
length on both sides; the local loop uses the same torch/peft code path a
job runs, in a fresh process of its own like a job's worker. Seconds per step
exclude model loading: locally the steps after the first are timed; for the
job, the gaps between its progress events as the client receives them. The
local loop runs before and after the job; their mean is the reference.

Last line: ``train_step_ratio=<grid s/step / local s/step>``. Goal (issue 4): <= 1.05.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from reticulum_grid import identity, rnsnet, trainer
from reticulum_grid.client import Grid
from reticulum_grid.datasets import read_examples
from reticulum_grid.default_model import DEFAULT_ALIAS, default_model_path
from reticulum_grid.localgrid import TowerProcess

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "secret.jsonl"
#: Steps left out of the timing on both sides (allocator and cache warm-up).
WARMUP = 3
SPEC = {"rank": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "learning_rate": 2e-4, "seq_len": 96, "batch_size": 4, "seed": 3, "checkpoint_every": 10_000}


def local_seconds_per_step(steps):
    import torch
    tokenizer, model = trainer.load_base(default_model_path(), "cpu")
    batches, _ = trainer.tokenize(read_examples(DATA), tokenizer, SPEC["seq_len"])
    model = trainer.add_lora(model, SPEC)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=SPEC["learning_rate"])
    model.train()
    per_epoch = -(-len(batches) // SPEC["batch_size"])
    times = []
    for step in range(steps):
        started = time.perf_counter()
        batch = trainer.make_batch(batches, SPEC, step, per_epoch, tokenizer.pad_token_id, "cpu")
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss.item()
        times.append(time.perf_counter() - started)
    return sum(times[WARMUP:]) / (steps - WARMUP)


def grid_seconds_per_step(steps, tmp):
    home = tmp / "client"
    client_id = identity.load_or_create(home / "identity").hash.hex()
    tower = TowerProcess(tmp, "bench-trainer", {DEFAULT_ALIAS: default_model_path()},
                         allow={client_id: ["train", "sync"]}).start()
    try:
        grid = Grid(home=home, connect=[tower.address])
        entry = grid.find_tower("bench-trainer", timeout=120)
        _, job_id = grid.train({"base": DEFAULT_ALIAS, "dataset": "", "output_alias": "bench-lora",
                                "max_steps": steps, **SPEC}, data_path=DATA, tower=entry.name)
        arrivals = [time.perf_counter() for e in grid.watch(job_id, entry.name) if e["type"] == "progress"]
        grid.close()
        return (arrivals[-1] - arrivals[WARMUP - 1]) / (len(arrivals) - WARMUP)
    finally:
        rnsnet.stop()
        tower.stop()


def local_in_subprocess(steps):
    out = subprocess.run([sys.executable, __file__, "--local-only", "--steps", str(steps)], check=True,
                         capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--local-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.local_only:
        print(local_seconds_per_step(args.steps))
        return
    before = local_in_subprocess(args.steps)
    with tempfile.TemporaryDirectory(prefix="rngrid-bench-train-") as tmp:
        grid = grid_seconds_per_step(args.steps, Path(tmp))
    after = local_in_subprocess(args.steps)
    local = (before + after) / 2
    print(json.dumps({"steps": args.steps, **SPEC}))
    print(f"local peft loop: {local:.3f} s/step (before {before:.3f}, after {after:.3f})")
    print(f"grid job:        {grid:.3f} s/step")
    print(f"train_step_ratio={grid / local:.3f}")


if __name__ == "__main__":
    main()
