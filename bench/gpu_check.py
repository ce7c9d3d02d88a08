"""GPU check: real towers on this machine's NVIDIA GPU, end to end, with figures.

Run by bench/gpu_check.sh once llama.cpp is built for the local GPU and the
models are written (bench/gpu_models.py: ``--big``, random weights shaped like
Llama-3-8B, Q8_0; ``--small``, shaped like the bundled SmolLM2-135M, F16;
``--hf``, that shape as a transformers checkpoint built from its config).
Every tower and client is its own process on 127.0.0.1. Parts, in order, each
printing ``key=value`` lines (and all of them again at the end):

1. ``machine``: nvidia-smi's GPU name, VRAM, driver, compute capability.
2. ``caps``: a tower serving the 8B model must announce backend ``cuda``, the
   GPU's name and VRAM within 5 % of nvidia-smi, and its caps/full must show
   the model fully offloaded by llama.cpp's own buffer report (host memory
   holds only the input embeddings, as llama.cpp always keeps them);
   ``stream``: TTFT and tokens/s of one stream (128 tokens, median of 3
   after a warm-up; bench.common's formula).
3. ``concurrency``: aggregate tokens/s of 1, 4 and 8 streams at once on one
   tower with 8 slots, beside llama-server driven directly (bench/concurrency.py).
4. ``split``: the 8B model split over two towers on the same GPU (the worker
   lends about a tenth of its need, so a few layers cross the RNS tunnel)
   against one tower holding it whole (bench/split.py).
5. ``train``: 20 LoRA steps of the training worker on the ``--hf``
   checkpoint (a transformers model built from a config, random weights;
   peft adds the adapter) on the GPU and on this machine's CPU, both in
   bf16: seconds per step after 3 warm-up steps.
6. ``dp``: the same job on 2 data-parallel ranks sharing the one GPU: NCCL
   first (it refuses two ranks on one device: reported), then gloo.

A part whose estimated time no longer fits before ``--deadline`` is skipped
and says so; a failed check or part is listed, and the exit status is 1.
``--out DIR`` receives gpu_check.json (rewritten after every part) and
logs.txt (the ends of the logs of failed parts). ``--dry-run`` prints the
plan and runs nothing; ``--rehearse`` runs every part on a machine without
a GPU (the GPU checks then fail, as they must) to try the script cheaply.

The parts are bench/gpu_check_inference.py's (1-4) and
bench/gpu_check_training.py's (5-6); this module runs them within the deadline.
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from bench.gpu_check_inference import (BIG_ALIAS, SMI_QUERY, STREAM_RUNS, STREAM_TOKENS, THREADS, part_caps,
                                       part_concurrency, part_machine, part_split)
from bench.gpu_check_training import STEPS, part_dp, part_train


class Check:
    """Figures and failures of one run, in ``out``/gpu_check.json: each part runs
    in a process of its own (RNS starts once per process), which loads it,
    adds its figures and saves it."""

    def __init__(self, out, deadline):
        self.out = Path(out)
        self.deadline = deadline
        self.figures = {}
        self.lines = []
        self.failures = []
        self.skipped = []
        self.parts = {}

    def load(self):
        path = self.out / "gpu_check.json"
        if path.exists():
            data = json.loads(path.read_text())
            self.figures, self.parts = data["figures"], data["parts"]
            self.failures, self.skipped, self.lines = data["failures"], data["skipped"], data["lines"]
        return self

    def put(self, key, value, part):
        """One figure: printed as ``key=value`` and kept for the JSON."""
        self.figures[key] = value
        self.parts.setdefault(part, {})[key] = value
        line = f"{key}={value}"
        self.lines.append(line)
        print(line, flush=True)
        self.save()  # a part stopped at its limit keeps what it measured

    def detail(self, part, **fields):
        self.parts.setdefault(part, {}).update(fields)

    def fail(self, part, message):
        self.failures.append(f"{part}: {message}")
        print(f"FAILED {part}: {message}", flush=True)
        self.save()

    def left(self):
        return self.deadline - time.time()

    def save(self):
        self.out.mkdir(parents=True, exist_ok=True)
        data = {"figures": self.figures, "parts": self.parts, "failures": self.failures, "skipped": self.skipped,
                "lines": self.lines}
        tmp = self.out / "gpu_check.json.tmp"
        tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
        os.replace(tmp, self.out / "gpu_check.json")

    def keep_logs(self, part, folder, limit=20_000):
        """The ends of the logs under ``folder`` into logs.txt (failed parts only)."""
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / "logs.txt", "a", errors="replace") as f:
            for log in sorted(Path(folder).rglob("*.log")):
                text = log.read_text(errors="replace")
                f.write(f"===== {part}: {log.relative_to(folder)} (last {min(len(text), limit)} of {len(text)} "
                        f"characters)\n{text[-limit:]}\n")



@dataclasses.dataclass(frozen=True)
class Part:
    """One part of the check: ``estimate_s``, the seconds it is expected to take on an
    H200 machine, model loads included (it starts only while that much time is left
    before the deadline, and bounds its own waits by it); ``run(check, opts, tmp)``;
    ``plan``, what the dry run says it does."""
    name: str
    estimate_s: int
    run: Callable[[Check, argparse.Namespace, str], None]
    plan: str


PARTS = (
    Part("machine", 5, part_machine, " ".join(SMI_QUERY)),
    Part("caps", 40, part_caps, f"a tower serving --big as {BIG_ALIAS} (n_ctx 4096, {THREADS} threads): caps "
         f"backend/device/VRAM vs nvidia-smi, llama.cpp's buffer report, {STREAM_RUNS} streams of {STREAM_TOKENS} tokens"),
    Part("concurrency", 50, part_concurrency,
         "bench.concurrency.throughput: 1, 4, 8 streams, 8 slots, 64 tokens, 2 rounds, grid vs direct"),
    Part("split", 70, part_split,
         "bench.split.run: whole vs split over two towers (worker lends ~11.5 % of the need), 3 pairs of 64 tokens"),
    Part("train", 60, part_train, f"reticulum_grid.training.trainer on --hf (else --small): {STEPS} LoRA steps in "
         "bf16, on the GPU, then with CUDA_VISIBLE_DEVICES='' on the CPU"),
    Part("dp", 50, part_dp, f"reticulum_grid.training.distributed, 2 ranks on one GPU: nccl, then gloo, {STEPS} steps"),
)
BY_NAME = {part.name: part for part in PARTS}


def plan_lines(opts):
    """What a run would do (the dry run's output)."""
    lines = [f"# deadline in {opts.budget:.0f} s; parts skipped when their estimate no longer fits"]
    for part in PARTS:
        lines.append(f"part {part.name} (~{part.estimate_s} s): {part.plan}")
    return lines


#: Seconds past its estimate a part may run before it is stopped (model loads vary).
GRACE_S = 90


def run_part(name, opts):
    """The child's side: one part, its figures added to the check's JSON."""
    check = Check(opts.out, opts.deadline).load()
    try:
        BY_NAME[name].run(check, opts, opts.tmp)
    except Exception as e:  # reported; the next part still runs
        check.fail(name, f"{type(e).__name__}: {e}")
        check.detail(name, traceback=traceback.format_exc()[-4000:])
    check.save()
    return 0


def run_all(opts, wanted):
    """The parent's side: every part in its own process, within the deadline."""
    check = Check(opts.out, time.time() + opts.budget)
    (Path(opts.out) / "gpu_check.json").unlink(missing_ok=True)
    check.save()
    for part in PARTS:
        name, estimate = part.name, part.estimate_s
        if name not in wanted:
            continue
        if check.left() < estimate:
            check.skipped.append(name)
            check.put(f"{name}_skipped", f"{check.left():.0f}s_left_needs_{estimate}s", name)
            check.save()
            continue
        begun = time.time()
        limit = max(5.0, min(check.left(), estimate + GRACE_S))
        with tempfile.TemporaryDirectory(prefix=f"rngrid-gpu-{name}-") as tmp:
            argv = [sys.executable, "-m", "bench.gpu_check", "--only", name, "--out", opts.out, "--tmp", tmp,
                    "--deadline", str(check.deadline), "--big", opts.big, "--small", opts.small, "--hf", opts.hf]
            proc = subprocess.Popen(argv + (["--rehearse"] if opts.rehearse else []), start_new_session=True)
            try:
                proc.wait(limit)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)  # the part's towers and runners are in its session
                proc.wait(30)
            check.load()
            if proc.returncode != 0:
                check.fail(name, f"stopped after {time.time() - begun:.0f} s (limit {limit:.0f} s)"
                           if proc.returncode < 0 else f"exit status {proc.returncode}")
            if any(f.startswith(f"{name}:") for f in check.failures):
                check.keep_logs(name, tmp)
        check.detail(name, seconds=round(time.time() - begun, 1))
        check.save()
    print("# gpu_check summary", flush=True)
    for line in check.lines:
        print(line)
    for failure in check.failures:
        print(f"FAILED {failure}")
    print(f"gpu_check_failures={len(check.failures)}", flush=True)
    return 1 if check.failures else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big", default="", help="the 8B-shaped GGUF (bench/gpu_models.py)")
    ap.add_argument("--small", default="", help="the SmolLM2-shaped GGUF (bench/gpu_models.py)")
    ap.add_argument("--hf", default="", help="the SmolLM2-shaped transformers checkpoint (default: train on --small)")
    ap.add_argument("--out", default="gpu-check-out", help="folder for gpu_check.json and logs.txt")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds this script may take")
    ap.add_argument("--parts", default=",".join(BY_NAME), help="comma-separated parts to run")
    ap.add_argument("--dry-run", action="store_true", help="print the plan; run nothing")
    ap.add_argument("--rehearse", action="store_true", help="run on a machine without a GPU (checks fail)")
    ap.add_argument("--only", default="", help=argparse.SUPPRESS)  # one part, in the child process
    ap.add_argument("--tmp", default="", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    wanted = [p for p in opts.parts.split(",") if p]
    unknown = sorted(set(wanted + ([opts.only] if opts.only else [])) - set(BY_NAME))
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}; parts: {', '.join(BY_NAME)}")
    if opts.dry_run:
        for line in plan_lines(opts):
            print(line)
        return 0
    if not (opts.big and opts.small):
        ap.error("--big and --small are needed (bench/gpu_models.py writes them)")
    opts.out = str(Path(opts.out).resolve())
    if opts.only:
        return run_part(opts.only, opts)
    return run_all(opts, wanted)


if __name__ == "__main__":
    sys.exit(main())
