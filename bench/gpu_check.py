"""GPU check: a tower on this machine's NVIDIA GPU, end to end, next to the CPU.

Run by bench/gpu_check.sh in a venv whose llama-server is the CUDA build.
In one run, on one machine:

1. A tower serving the bundled model (n_gpu_layers -1) must announce backend
   ``cuda``, the GPU's name, and VRAM within 5 % of nvidia-smi's total, and
   its caps/full must show the model offloaded (llama.cpp's buffer report).
2. 256 tokens at temperature 0 stream from it and from a CPU tower (the same
   build with CUDA_VISIBLE_DEVICES='', so llama.cpp sees no GPU): TTFT (ms,
   request to first text, as the client sees it) and tokens/s ((tokens - 1) /
   (last text - first text), as every benchmark counts it: bench/common.py),
   median of 3 runs after a warm-up.
3. 20 LoRA steps of the training worker on CUDA and on the CPU (the same
   spec; CUDA_VISIBLE_DEVICES='' for the CPU): seconds per step after 3
   warm-up steps, and the device and precision the job reports.

Failed checks are listed and the exit status is 1. Last line:
``gpu_vs_cpu_tokens=<GPU tokens/s / CPU tokens/s>``.
``--dry-run`` prints what would run and runs nothing (standard library only).
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

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "secret.jsonl"
PROMPT = "Count from 1 to 500, separated by commas: 1, 2, 3,"
RUNS = 3
WARMUP_STEPS = 3
VRAM_TOLERANCE = 0.05
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}
SMI_QUERY = ["nvidia-smi", "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"]
SPEC = {"rank": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "learning_rate": 2e-4, "seq_len": 96, "batch_size": 4, "seed": 3, "checkpoint_every": 10_000}


def plan(tmp, tokens, steps):
    """[(what, extra env, argv)] this check runs, in order."""
    tower = [sys.executable, "-m", "reticulum_grid", "-v", "tower", "--config"]
    return [
        ("query GPUs", {}, SMI_QUERY),
        ("GPU tower", {}, tower + [f"{tmp}/gpu-tower/tower.toml"]),
        ("CPU tower", NO_GPU, tower + [f"{tmp}/cpu-tower/tower.toml"]),
        (f"stream {tokens} tokens x{RUNS} from each tower", {}, ["(grid client in this process)"]),
        (f"train {steps} LoRA steps on CUDA", {}, worker(Path(tmp) / "job-cuda")),
        (f"train {steps} LoRA steps on the CPU", NO_GPU, worker(Path(tmp) / "job-cpu")),
    ]


def worker(job_dir):
    return [sys.executable, "-m", "reticulum_grid.training.trainer", str(job_dir)]


def show(steps):
    for what, env, argv in steps:
        print(f"# {what}\n" + " ".join([*(f"{k}={v!r}" for k, v in env.items()), *argv]))


def nvidia_smi():
    """[(name, total MiB)] per GPU."""
    out = subprocess.run(SMI_QUERY, capture_output=True, text=True, check=True, timeout=30).stdout
    rows = [[x.strip() for x in line.split(",")] for line in out.splitlines() if line.strip()]
    return [(name, int(total)) for name, total, _free in rows]


def check_caps(grid, entry, smi, failures):
    """caps/full of the GPU tower against nvidia-smi; prints what it saw."""
    full = grid.caps_full([entry], timeout=30)[0][1]
    hw = full.caps.hardware
    smi_total = sum(total for _, total in smi)
    off = abs(hw.vram_total_mib - smi_total) / max(smi_total, 1)
    print(f"caps: backend={hw.backend} device={hw.device!r} gpus={hw.gpus} vram_total_mib={hw.vram_total_mib} "
          f"vram_free_mib={hw.vram_free_mib}; nvidia-smi: {len(smi)} GPU(s) {smi[0][0]!r} total {smi_total} MiB "
          f"({off * 100:.1f} % off)")
    print(f"caps/full gpus: {full.gpus}")
    model = next((b for b in full.blobs if b.kind == "model" and b.loaded), None)
    keys = ("on_gpu", "gpu_model_mib", "host_model_mib", "gpu_mib", "host_mib", "vram_mib", "need_mib")
    print(f"placement: {json.dumps({k: getattr(model, k, None) for k in keys})}")
    if hw.backend != "cuda":
        failures.append(f"caps say backend {hw.backend}, not cuda")
    if not smi[0][0].startswith(hw.device) and hw.device not in smi[0][0]:
        failures.append(f"caps device {hw.device!r} is not nvidia-smi's {smi[0][0]!r}")
    if hw.gpus != len(smi):
        failures.append(f"caps count {hw.gpus} GPUs, nvidia-smi {len(smi)}")
    if off > VRAM_TOLERANCE:
        failures.append(f"caps VRAM {hw.vram_total_mib} MiB is {off * 100:.1f} % off nvidia-smi's {smi_total} MiB")
    if model is None or not model.on_gpu:
        failures.append("the model is not offloaded to the GPU")


def stream(grid, tower, tokens):
    """(median TTFT s, median tokens/s) of RUNS streams of ``tokens`` tokens, after a warm-up."""
    from bench.common import tokens_per_s
    from reticulum_grid.client import Usage
    from reticulum_grid.inference.default_model import DEFAULT_ALIAS
    runs = []
    for k in range(RUNS + 1):
        started, first, last, usage = time.perf_counter(), None, None, None
        payload = {"model": DEFAULT_ALIAS, "prompt": PROMPT, "max_tokens": tokens if k else 16, "temperature": 0.0}
        for piece in grid.execute("ai/inference", payload, tower=tower):
            if isinstance(piece, Usage):
                usage = piece
            elif piece:
                last = time.perf_counter()
                first = first or last
        if k:
            runs.append((first - started, tokens_per_s(usage.completion_tokens, first, last), usage.completion_tokens))
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs), runs[-1][2]


def train(job_dir, steps, env):
    """(seconds per step after the warm-up steps, the started event) of one worker run."""
    from reticulum_grid.inference.default_model import default_model_path
    job_dir.mkdir(parents=True)
    spec = {**SPEC, "max_steps": steps, "base_path": str(default_model_path()), "dataset_path": str(DATA),
            "output_alias": "gpu-check"}
    (job_dir / "spec.json").write_text(json.dumps(spec))
    out = subprocess.run(worker(job_dir), capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", **env}, timeout=300)
    events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode:
        raise RuntimeError(f"worker failed: {events[-1] if events else out.stderr[-2000:]}")
    elapsed = [e["elapsed_s"] for e in events if e.get("event") == "step"]
    started = next(e for e in events if e.get("event") == "started")
    return (elapsed[-1] - elapsed[WARMUP_STEPS - 1]) / (len(elapsed) - WARMUP_STEPS), started


def run(tokens, steps):
    from reticulum_grid.client import Grid
    from reticulum_grid.inference.default_model import DEFAULT_ALIAS, default_model_path
    from reticulum_grid.node import identity, rnsnet
    from reticulum_grid.node.localgrid import TowerProcess, trust_local_towers

    failures = []
    smi = nvidia_smi()
    with tempfile.TemporaryDirectory(prefix="rngrid-gpu-check-") as tmp:
        tmp = Path(tmp)
        home = tmp / "client"
        allow = {identity.load_or_create(home / "identity").hash.hex(): ["infer"]}
        trust_local_towers(home)  # this client trusts the towers it starts
        models = {DEFAULT_ALIAS: default_model_path()}
        towers = []
        try:
            towers.append(TowerProcess(tmp, "gpu-tower", models, allow=allow, threads=0).start(timeout=180))
            saved = os.environ.get("CUDA_VISIBLE_DEVICES")
            os.environ.update(NO_GPU)  # the CPU tower's process inherits it
            try:
                towers.append(TowerProcess(tmp, "cpu-tower", models, allow=allow, threads=0).start(timeout=180))
            finally:
                os.environ.pop("CUDA_VISIBLE_DEVICES") if saved is None else os.environ.update(
                    CUDA_VISIBLE_DEVICES=saved)
            grid = Grid(home=home, connect=[t.address for t in towers])
            check_caps(grid, grid.find_tower("gpu-tower", timeout=120), smi, failures)
            grid.find_tower("cpu-tower", timeout=120)
            gpu = stream(grid, "gpu-tower", tokens)
            cpu = stream(grid, "cpu-tower", tokens)
            grid.close()
        finally:
            rnsnet.stop()
            for tower in towers:
                tower.stop()
        for name, (ttft, tps, n) in (("gpu", gpu), ("cpu", cpu)):
            print(f"stream {name}: {n} tokens, ttft_ms={ttft * 1000:.1f} tokens_per_s={tps:.1f} (median of {RUNS})")
        gpu_step, gpu_job = train(tmp / "job-cuda", steps, {})
        cpu_step, cpu_job = train(tmp / "job-cpu", steps, NO_GPU)
    for step, job in ((gpu_step, gpu_job), (cpu_step, cpu_job)):
        print(f"train {job['device']} ({job.get('device_name')}, {job.get('precision')}): {steps} steps, "
              f"s_per_step={step:.4f}")
    if not gpu_job["device"].startswith("cuda"):
        failures.append(f"the training job ran on {gpu_job['device']}, not CUDA")
    print(f"gpu_vs_cpu_train={cpu_step / gpu_step:.2f}")
    for failure in failures:
        print(f"FAILED: {failure}")
    print(f"gpu_vs_cpu_tokens={gpu[1] / cpu[1]:.2f}")
    return 1 if failures else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--dry-run", action="store_true", help="print what would run; run nothing")
    opts = ap.parse_args(argv)
    if opts.steps <= WARMUP_STEPS + 1:
        ap.error(f"--steps must be more than {WARMUP_STEPS + 1}")
    if opts.dry_run:
        show(plan("$TMP", opts.tokens, opts.steps))
        return 0
    return run(opts.tokens, opts.steps)


if __name__ == "__main__":
    sys.exit(main())
