"""The GPU check's inference parts (bench/gpu_check.py runs them, each in its own process).

``machine``: nvidia-smi's view of the GPUs, which the others are checked
against. ``caps``: a tower serving the 8B-shaped model announces backend
``cuda``, the GPU's name and VRAM within ``VRAM_TOLERANCE`` of nvidia-smi, and
llama.cpp's own buffer report shows the model fully offloaded; then TTFT and
tokens/s of one stream. ``concurrency`` and ``split`` run bench/concurrency.py
and bench/split.py on that model. Each part is ``part_NAME(check, opts, tmp)``
and reports through ``check`` (bench.gpu_check.Check).
"""

import argparse
import dataclasses
import os
import statistics
import subprocess
import time
from pathlib import Path

VRAM_TOLERANCE = 0.05
SMI_QUERY = ["nvidia-smi", "--query-gpu=name,memory.total,memory.free,driver_version,compute_cap",
             "--format=csv,noheader,nounits"]
BIG_ALIAS = "bench-8b"
PROMPT = "{k}. Count from {k} to 5000, separated by commas: {k},"
#: llama.cpp CPU threads of each tower (the GPU does the arithmetic; sampling and the rest stay here).
THREADS = 4
STREAM_TOKENS, STREAM_RUNS = 128, 3


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
    from bench import split, split_models
    figures = split.run(opts.big, runs=3, max_tokens=64, threads=THREADS, lends=split_models.split_lends(opts.big),
                        root=tmp, raw=False)
    check.detail("split", **figures)
    check.put("split_plan", figures["plan"].replace(" ", ""), "split")
    check.put("whole_tokens_per_s", figures["single_tokens_per_s"], "split")
    check.put("split_tokens_per_s", figures["split_tokens_per_s"], "split")
    check.put("split_vs_whole", figures["split_vs_single"], "split")
    check.put("split_added_ttft_ms", figures["added_ttft_ms"], "split")
    if "load_mb_s" in figures:  # the coordinator's own count of the bytes that crossed while it loaded
        check.put("split_load_mb_s", figures["load_mb_s"], "split")

