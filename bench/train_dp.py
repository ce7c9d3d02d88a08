"""Data-parallel LoRA scaling: the same job on 2 ranks vs 1 rank.

Runs the multi-tower worker (reticulum_grid/training/distributed.py) directly
as processes on loopback: with one rank and with two ranks over gloo through
the store front, same base (SmolLM2-135M GGUF), dataset, LoRA settings, global
batch, seed and steps, in ``--pairs`` pairs whose order alternates (one rank
first, then two; then two first). Seconds per step come from the workers' own
step timestamps (``elapsed_s``) after WARMUP steps, so model loading is outside
them; each figure is the median over the pairs with its range, and the scaling
the median of the per-pair ratios. Also printed: the LoRA gradient bytes
all-reduced per step and the time of one such all-reduce (measured by the
worker before training).

On a machine whose cores both ranks share (2 cores here) two ranks cannot be
faster than one: the figure shows the overhead, not the gain. The script then
works out, on paper, what two GPU towers on a 1 Gbit/s tailnet would give for
this job: per step each of 2 ranks sends and receives the gradient bytes once
(ring all-reduce: 2 (N-1)/N x bytes), so t_comm = bytes / 125 MB/s; one rank
computes a step in t1, two in t1/2 each; scaling = t1 / (t1/2 + t_comm) when
the all-reduce does not overlap the backward pass and t1 / max(t1/2, t_comm)
when DDP overlaps it fully. t1 on a GPU is estimated from FLOPs (6 x params x
tokens per step) at an assumed sustained rate, stated in the output.

Last line: ``dp_scaling=<samples/s of 2 ranks / samples/s of 1 rank>`` (median of the pairs).

With ``--profile NAME`` (a link profile of the network lab, testbed/lab/profiles.py;
needs root) it compares instead the job's ways to sync on 2 ranks: DDP
against local steps with H = 8 and H = 32, each with plain averaging (the
default outer step) and with DiLoCo's (Nesterov, lr 0.7, momentum 0.9;
training/outer.py), on the same data, samples, seed and steps (``--steps``,
default 32). A step is one global batch of ``batch_size`` examples in every
mode: DDP takes one AdamW step on its gradient; local steps give each of the
2 replicas its half of the rows and one AdamW step on them, at the same
learning rate and decay; either way the job sees the same samples in the
same order. Each mode runs once between two network namespaces joined by
the lab's shaping bridge (testbed/lab/bridge.py) with the profile's rate,
delay, jitter and loss, and once on loopback (a mode's two runs back to
back, their order alternating between modes). Bytes moved are the bridge's
counters (every frame both ways, headers and the job's start-up included);
the workers' own count of the bytes they put into collectives is printed
beside them. Wall time is the training's (the last step's ``elapsed_s``:
model loading and joining excluded). Final loss is the mean token loss of
each run's adapter over the whole dataset, computed here. Last lines, for
H = 32 with the job's default outer step (bench/train_local.py HEADLINE):
``local_bytes_vs_ddp=`` (its link bytes / DDP's) and ``local_loss_vs_ddp=``
(its final loss / DDP's).
"""

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reticulum_grid.inference.default_model import default_model_path  # noqa: E402
from reticulum_grid.training import rendezvous  # noqa: E402

DATA = ROOT / "testbed" / "data" / "secret.jsonl"
WARMUP = 2
SPEC = {"rank": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "learning_rate": 2e-4, "seq_len": 64, "batch_size": 8, "seed": 0, "checkpoint_every": 10_000,
        "output_alias": "bench-dp"}
BASE_PARAMS = 134.5e6  # SmolLM2-135M
LINK_BYTES_PER_S = 125e6  # 1 Gbit/s
#: torch threads per rank, the same in both runs: two ranks of 2 OpenMP threads each on
#: 2 cores spin against each other (a step took 20x longer); one thread per rank does not.
THREADS = 1
GPU_FLOPS = 100e12  # assumed sustained bf16 rate of one data-centre GPU on this small model


def run(tmp, name, steps, dp, extra=None, ranks=None):
    """Events of each rank's worker for one job. ``extra``: spec keys to add;
    ``ranks``: per rank, (dp keys to add, argv prefix: a namespace to run in)."""
    procs = []
    for rank in range(dp["world_size"]):
        own, prefix = (ranks or {}).get(rank, ({}, []))
        job_dir = tmp / f"{name}-{rank}"
        job_dir.mkdir()
        spec = {**SPEC, **(extra or {}), "max_steps": steps, "base_path": str(default_model_path()),
                "dataset_path": str(DATA), "dp": {**dp, **own, "rank": rank}}
        (job_dir / "spec.json").write_text(json.dumps(spec))
        procs.append(subprocess.Popen(prefix + [sys.executable, "-m", "reticulum_grid.training.distributed",
                                                str(job_dir)],
                                      stdout=subprocess.PIPE, stderr=open(job_dir / "worker.log", "wb"), text=True,
                                      env={**os.environ, "OMP_NUM_THREADS": str(THREADS), "PYTHONPATH": str(ROOT)}))
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    for p, name_ in zip(procs, range(len(procs))):
        if p.returncode != 0:
            raise SystemExit(f"rank {name_} failed: {outs[name_][-1000:]}")
    return [json.loads(line) for line in outs[0].splitlines() if line.startswith("{")]


def seconds_per_step(events):
    steps = [e for e in events if e["event"] == "step"]
    a, b = steps[WARMUP - 1], steps[-1]
    return (b["elapsed_s"] - a["elapsed_s"]) / (b["step"] - a["step"])


def spread(values, fmt=".3f"):
    return f"{statistics.median(values):{fmt}} (range {min(values):{fmt}}-{max(values):{fmt}}, n={len(values)})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 12; 32 with --profile)")
    parser.add_argument("--pairs", type=int, default=3, help="1-rank/2-rank pairs (their order alternates)")
    parser.add_argument("--profile", default=None, help="compare DDP with local steps over this lab link profile")
    parser.add_argument("--modes", default="", help="with --profile: only these of bench/train_local.py's MODES "
                                                    "(comma-separated labels; DDP and the default's always run)")
    args = parser.parse_args()
    if args.profile:
        from bench.train_local import compare
        return compare(args.profile, args.steps or 32, run, SPEC, args.modes)
    args.steps = args.steps or 12
    one_s, two_s, allreduce = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for k in range(args.pairs):
            for ranks in ((1, 2) if k % 2 == 0 else (2, 1)):
                if ranks == 1:
                    one = run(tmp, f"one-{k}", args.steps, {"world_size": 1, "units": 1, "host": "127.0.0.1",
                                                            "port": 1, "dataplane": "127.0.0.1", "secret": ""})
                    one_s.append(seconds_per_step(one))
                else:
                    two = run(tmp, f"two-{k}", args.steps, {"world_size": 2, "units": 2, "host": "127.0.0.1",
                                                            "port": rendezvous.free_port("127.0.0.1"),
                                                            "dataplane": "127.0.0.1", "peers": ["127.0.0.1"],
                                                            "secret": secrets.token_hex(32)})
                    two_s.append(seconds_per_step(two))
                    started = next(e for e in two if e["event"] == "started")
                    allreduce.append(started["allreduce_s"])
                print(f"pair {k + 1}: {ranks} rank(s) {(one_s if ranks == 1 else two_s)[-1]:.3f} s/step", flush=True)
    batch = SPEC["batch_size"]
    scaling = [a / b for a, b in zip(one_s, two_s)]
    t1, t2 = statistics.median(one_s), statistics.median(two_s)
    grad_bytes = started["grad_bytes"]
    print(f"1 rank : {spread(one_s)} s/step, {batch / t1:.2f} samples/s")
    print(f"2 ranks: {spread(two_s)} s/step, {batch / t2:.2f} samples/s (both ranks share this machine's cores; noisy)")
    print(f"per pair, 2 ranks vs 1 (samples/s): {spread(scaling, '.2f')}")
    print(f"LoRA gradients all-reduced per step: {grad_bytes} bytes ({grad_bytes / 2**20:.2f} MiB); "
          f"one all-reduce on loopback: {spread([s * 1000 for s in allreduce], '.1f')} ms")
    comm = grad_bytes * 2 * (2 - 1) / 2 / LINK_BYTES_PER_S
    tokens = batch * SPEC["seq_len"]
    gpu_t1 = 6 * BASE_PARAMS * tokens / GPU_FLOPS
    print(f"on paper, 2 GPU towers on 1 Gbit/s: t_comm = {grad_bytes} B / 125 MB/s = {comm * 1000:.1f} ms per step")
    for label, step_t in (("this job (batch %d x %d tokens)" % (batch, SPEC["seq_len"]), gpu_t1),
                          ("batch 32 x 512 tokens", 6 * BASE_PARAMS * 32 * 512 / GPU_FLOPS),
                          ("batch 128 x 1024 tokens", 6 * BASE_PARAMS * 128 * 1024 / GPU_FLOPS)):
        print(f"  {label}: t1 ~ {step_t * 1000:.1f} ms at {GPU_FLOPS / 1e12:.0f} TFLOP/s -> scaling "
              f"{step_t / (step_t / 2 + comm):.2f} (no overlap) .. {step_t / max(step_t / 2, comm):.2f} (full overlap)")
    print(f"dp_scaling={statistics.median(scaling):.2f}")


if __name__ == "__main__":
    main()
