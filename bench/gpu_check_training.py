"""The GPU check's training parts (bench/gpu_check.py runs them, each in its own process).

``train``: 20 LoRA steps of the training worker (reticulum_grid.training.trainer)
on the GPU and on this machine's CPU, both in bf16: seconds per step after the
warm-up steps. ``dp``: the same job on 2 data-parallel ranks sharing the one GPU
(reticulum_grid.training.distributed), NCCL first (it refuses two ranks on one
device: reported), then gloo. Each part is ``part_NAME(check, opts, tmp)`` and
reports through ``check`` (bench.gpu_check.Check).
"""

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "testbed" / "data" / "secret.jsonl"
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}
STEPS, WARMUP_STEPS = 20, 3
TRAIN_SPEC = {"rank": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
              "learning_rate": 2e-4, "seq_len": 96, "batch_size": 4, "seed": 3, "checkpoint_every": 10_000,
              "precision": "bf16", "output_alias": "gpu-check"}


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

