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
"""

import argparse
import dataclasses
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "testbed" / "data" / "secret.jsonl"
VRAM_TOLERANCE = 0.05
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}
SMI_QUERY = ["nvidia-smi", "--query-gpu=name,memory.total,memory.free,driver_version,compute_cap",
             "--format=csv,noheader,nounits"]
BIG_ALIAS = "bench-8b"
PROMPT = "{k}. Count from {k} to 5000, separated by commas: {k},"
#: llama.cpp CPU threads of each tower (the GPU does the arithmetic; sampling and the rest stay here).
THREADS = 4
STREAM_TOKENS, STREAM_RUNS = 128, 3
STEPS, WARMUP_STEPS = 20, 3
TRAIN_SPEC = {"rank": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
              "learning_rate": 2e-4, "seq_len": 96, "batch_size": 4, "seed": 3, "checkpoint_every": 10_000,
              "precision": "bf16", "output_alias": "gpu-check"}


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


def nvidia_smi():
    """[{name, total_mib, free_mib, driver, compute_cap}] per GPU."""
    out = subprocess.run(SMI_QUERY, capture_output=True, text=True, check=True, timeout=30).stdout
    gpus = []
    for line in out.splitlines():
        if line.strip():
            name, total, free, driver, cap = [x.strip() for x in line.split(",")]
            gpus.append({"name": name, "total_mib": int(total), "free_mib": int(free), "driver": driver,
                         "compute_cap": cap})
    return gpus


def part_machine(check, opts, tmp):
    from reticulum_grid.node.hardware import cpu_name
    check.put("cpu", f"{cpu_name()} x{os.cpu_count()}", "machine")
    if opts.rehearse:
        check.detail("machine", gpus=[])
        return
    gpus = nvidia_smi()
    check.detail("machine", gpus=gpus)
    check.put("gpu_name", gpus[0]["name"], "machine")
    check.put("gpu_count", len(gpus), "machine")
    check.put("gpu_vram_mib", sum(g["total_mib"] for g in gpus), "machine")
    check.put("gpu_driver", gpus[0]["driver"], "machine")
    check.put("gpu_compute_cap", gpus[0]["compute_cap"], "machine")


def _client(tmp):
    """(client home, its identity hash) trusting every tower this process starts."""
    from reticulum_grid.node import identity
    from reticulum_grid.node.localgrid import trust_local_towers
    home = Path(tmp) / "client"
    client_id = identity.load_or_create(home / "identity").hash.hex()
    trust_local_towers(home)
    return home, client_id


def _embedding_mib(path):
    import gguf
    tensor = next(t for t in gguf.GGUFReader(path).tensors if t.name == "token_embd.weight")
    return int(tensor.n_bytes) / 2**20


def part_caps(check, opts, tmp):
    """caps, offload and one stream of the 8B model on one tower."""
    from bench.common import time_stream
    from reticulum_grid.client import Grid, Usage
    from reticulum_grid.node import rnsnet
    from reticulum_grid.node.localgrid import TowerProcess

    home, client_id = _client(tmp)
    tower = TowerProcess(tmp, "gpu-tower", {BIG_ALIAS: {"path": opts.big, "n_ctx": 4096, "parallel": 1}},
                         allow={client_id: ["infer"]}, threads=THREADS).start(timeout=120)
    try:
        grid = Grid(home=home, connect=[tower.address])
        entry = grid.find_tower("gpu-tower", timeout=120)
        started, model = time.monotonic(), {}
        while time.monotonic() - started < 240:  # the model loads in the background
            reply = grid.caps_full([entry], timeout=30)[0][1]
            model = next((b for b in reply.blobs if b.alias == BIG_ALIAS and b.loaded), None)
            if model:
                break
            time.sleep(1)
        hw = reply.caps.hardware
        check.put("caps_backend", hw.backend, "caps")
        check.put("caps_device", hw.device, "caps")
        check.put("caps_gpus", hw.gpus, "caps")
        check.put("caps_vram_total_mib", hw.vram_total_mib, "caps")
        check.detail("caps", caps_full_gpus=[dataclasses.asdict(g) for g in reply.gpus],
                     blob=model and {k: v for k, v in model.to_map().items() if k != "blob_id"})
        if hw.backend != "cuda":
            check.fail("caps", f"the caps say backend {hw.backend}, not cuda")
        smi = check.parts.get("machine", {}).get("gpus") or []
        if smi:
            total = sum(g["total_mib"] for g in smi)
            off = abs(hw.vram_total_mib - total) / max(total, 1) * 100
            check.put("caps_vram_off_pct", round(off, 2), "caps")
            if off > VRAM_TOLERANCE * 100:
                check.fail("caps", f"caps VRAM {hw.vram_total_mib} MiB is {off:.1f} % off nvidia-smi's {total} MiB")
            if hw.device not in smi[0]["name"] and not smi[0]["name"].startswith(hw.device):
                check.fail("caps", f"caps device {hw.device!r} is not nvidia-smi's {smi[0]['name']!r}")
        if not model:
            check.fail("caps", "the 8B model never showed as loaded in caps/full")
            return
        embeddings = _embedding_mib(opts.big)
        check.put("offload_gpu_model_mib", model.gpu_model_mib, "caps")
        check.put("offload_host_model_mib", model.host_model_mib, "caps")
        check.put("offload_vram_mib", model.vram_mib, "caps")
        full = bool(model.on_gpu) and (model.host_model_mib or 0) <= embeddings + 1
        check.put("offload_full", "yes" if full else "no", "caps")
        check.detail("caps", input_embeddings_mib=round(embeddings, 1))
        if not full:
            check.fail("caps", f"the model is not fully offloaded: {model.gpu_model_mib} MiB on GPUs, "
                               f"{model.host_model_mib} MiB in host memory (embeddings {embeddings:.0f} MiB)")

        def one(k, tokens):
            pieces = grid.execute("ai/inference", {"model": BIG_ALIAS, "prompt": PROMPT.format(k=k),
                                                   "max_tokens": tokens, "temperature": 0.0}, tower="gpu-tower")
            return time_stream(pieces, lambda p: not isinstance(p, Usage) and bool(p), tokens, "stream")[:2]

        one(1, 16)
        runs = [one(10 + k, STREAM_TOKENS) for k in range(STREAM_RUNS)]
        check.detail("caps", stream_runs=[[round(a * 1000, 1), round(b, 1)] for a, b in runs])
        check.put("stream_ttft_ms", round(statistics.median(r[0] for r in runs) * 1000, 1), "caps")
        check.put("stream_tokens_per_s", round(statistics.median(r[1] for r in runs), 1), "caps")
        grid.close()
    finally:
        rnsnet.stop()
        tower.stop()


def part_concurrency(check, opts, tmp):
    from bench import concurrency
    args = argparse.Namespace(model=opts.big, counts=[1, 4, 8], slots=8, threads=THREADS, max_tokens=64,
                              rounds=2)
    figures = concurrency.throughput(args, tmp)
    check.detail("concurrency", **figures)
    for n in ("1", "4", "8"):
        check.put(f"concurrent_{n}_tokens_per_s", figures["streams"][n]["grid"]["aggregate_tokens_per_s"],
                  "concurrency")
        check.put(f"concurrent_{n}_direct_tokens_per_s", figures["streams"][n]["direct"]["aggregate_tokens_per_s"],
                  "concurrency")
    check.put("concurrent_vs_llama_server", figures["concurrent_vs_llama_server"], "concurrency")


def part_split(check, opts, tmp):
    from bench import split
    figures = split.run(opts.big, runs=3, max_tokens=64, threads=THREADS, lends=split.split_lends(opts.big),
                        root=tmp, raw=False)
    check.detail("split", **figures)
    check.put("split_plan", figures["plan"].replace(" ", ""), "split")
    check.put("whole_tokens_per_s", figures["single_tokens_per_s"], "split")
    check.put("split_tokens_per_s", figures["split_tokens_per_s"], "split")
    check.put("split_vs_whole", figures["split_vs_single"], "split")
    check.put("split_added_ttft_ms", figures["added_ttft_ms"], "split")
    if "load_mb_s" in figures:  # the coordinator's own count of the bytes that crossed while it loaded
        check.put("split_load_mb_s", figures["load_mb_s"], "split")


def _events(proc, deadline):
    """JSON events from a worker's stdout until it ends or ``deadline`` (time.time())."""
    import selectors
    events, buffer = [], b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.time() < deadline:
            if not sel.select(timeout=1.0):
                if proc.poll() is not None:
                    break
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            events += [json.loads(line) for line in lines if line.startswith(b"{")]
    return events


def _steps_s(events):
    """Seconds per step after the warm-up steps (None when too few steps ran)."""
    elapsed = [e["elapsed_s"] for e in events if e.get("event") == "step"]
    if len(elapsed) < WARMUP_STEPS + 2:
        return None
    return (elapsed[-1] - elapsed[WARMUP_STEPS - 1]) / (len(elapsed) - WARMUP_STEPS)


def _worker(module, job_dir, spec, env, deadline):
    """Run a training worker on ``spec`` until it ends or ``deadline``: (events, exit status or None)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "spec.json").write_text(json.dumps(spec))
    with open(job_dir / "worker.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", module, str(job_dir)], stdout=subprocess.PIPE, stderr=log,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", **env})
        try:
            events = _events(proc, deadline)
            proc.wait(max(1.0, min(30.0, deadline - time.time())))  # its output ended: it is exiting
        except subprocess.TimeoutExpired:
            pass
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
    return events, proc.returncode


def part_train(check, opts, tmp):
    spec = {**TRAIN_SPEC, "max_steps": STEPS, "base_path": opts.hf or opts.small, "dataset_path": str(DATA)}
    per = {}
    for side, env in (("gpu", {}), ("cpu", NO_GPU)):
        # The CPU side gets what is left of the part's time; its steps so far count if it runs out.
        deadline = min(check.deadline, time.time() + (60 if side == "gpu" else 150))
        events, code = _worker("reticulum_grid.training.trainer", Path(tmp) / f"job-{side}", spec, env, deadline)
        started = next((e for e in events if e.get("event") == "started"), {})
        steps = sum(e.get("event") == "step" for e in events)
        errors = [e.get("message") for e in events if e.get("event") == "error"]
        check.detail("train", **{side: {"device": started.get("device"), "device_name": started.get("device_name"),
                                        "precision": started.get("precision"), "steps": steps, "exit": code,
                                        "error": errors[0] if errors else None}})
        per[side] = _steps_s(events)
        if per[side] is None:
            check.fail("train", f"{side}: {steps} steps ran ({errors[0] if errors else f'exit status {code}'})")
            continue
        check.put(f"train_{side}_s_per_step", round(per[side], 4), "train")
        check.put(f"train_{side}_device", f"{started.get('device')}:{started.get('precision')}", "train")
        if side == "gpu" and not str(started.get("device", "")).startswith("cuda") and not opts.rehearse:
            check.fail("train", f"the GPU job ran on {started.get('device')}")
    if per.get("gpu") and per.get("cpu"):
        check.put("train_gpu_vs_cpu", round(per["cpu"] / per["gpu"], 2), "train")
    check.detail("train", one_rank_s_per_step=per.get("gpu"))


def part_dp(check, opts, tmp):
    """Two data-parallel ranks on the one GPU: NCCL (refused there), then gloo."""
    from reticulum_grid.training import rendezvous
    spec = {**TRAIN_SPEC, "max_steps": STEPS, "base_path": opts.hf or opts.small, "dataset_path": str(DATA)}
    for backend in ("nccl", "gloo"):
        if opts.rehearse and backend == "nccl":
            continue
        dp = {"world_size": 2, "units": 2, "host": "127.0.0.1", "dataplane": "127.0.0.1",
              "port": rendezvous.free_port("127.0.0.1"), "peers": ["127.0.0.1"], "secret": secrets.token_hex(32),
              "backend": backend}
        deadline = min(check.deadline, time.time() + (45 if backend == "nccl" else 90))
        ranks = []
        for rank in (0, 1):
            job = Path(tmp) / f"dp-{backend}-{rank}"
            job.mkdir(parents=True)
            (job / "spec.json").write_text(json.dumps({**spec, "dp": {**dp, "rank": rank}}))
            log = open(job / "worker.log", "wb")
            ranks.append((subprocess.Popen([sys.executable, "-m", "reticulum_grid.training.distributed", str(job)],
                                           stdout=subprocess.PIPE, stderr=log,
                                           env={**os.environ, "HF_HUB_OFFLINE": "1"}), log))
        try:
            events = _events(ranks[0][0], deadline)
        finally:
            for proc, log in ranks:
                if proc.poll() is None:
                    try:
                        proc.wait(max(1.0, min(20.0, deadline - time.time())))
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(30)
                log.close()
        errors = [e.get("message") for e in events if e.get("event") == "error"]
        step_s = _steps_s(events)
        started = next((e for e in events if e.get("event") == "started"), {})
        check.detail("dp", **{backend: {"exit": [p.returncode for p, _ in ranks], "error": errors[0] if errors else
                                        None, "steps": sum(e.get("event") == "step" for e in events),
                                        "device": started.get("device"), "allreduce_s": started.get("allreduce_s"),
                                        "grad_bytes": started.get("grad_bytes")}})
        if step_s is None:
            reason = (errors[0] if errors else f"exit statuses {[p.returncode for p, _ in ranks]}")[:300]
            check.put(f"dp_{backend}", "refused" if backend == "nccl" else "failed", "dp")
            check.detail("dp", **{f"{backend}_reason": reason})
            if backend == "gloo":
                check.fail("dp", f"gloo: {reason}")
            continue
        check.put(f"dp_{backend}", "ran", "dp")
        check.put(f"dp_{backend}_s_per_step", round(step_s, 4), "dp")
        one = check.parts.get("train", {}).get("one_rank_s_per_step")
        if one:
            check.put(f"dp_{backend}_vs_one_rank", round(one / step_s, 2), "dp")
        if backend == "nccl":
            break  # NCCL ran: gloo adds nothing


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
