"""Shared by the multi-tower training tests: rank worker processes started by
hand, what they leave, towers that enlist each other, and the job they train."""

import contextlib
import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from reticulum_grid.inference.default_model import DEFAULT_ALIAS, default_model_path
from testbed import SECRET_DATASET

WORKER = [sys.executable, "-m", "reticulum_grid.training.distributed"]
#: Ranks here share 2 cores with each other and the towers: torch's OpenMP threads
#: spinning against each other made a step 20x slower than one thread per rank.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
#: The job the towers train in these tests (genome/train's fields).
JOB = {"base": DEFAULT_ALIAS, "dataset": "", "output_alias": "dp-lora", "rank": 8, "alpha": 16.0,
       "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "learning_rate": 4e-3, "max_steps": 8,
       "seq_len": 48, "batch_size": 4, "seed": 3, "checkpoint_every": 3}
DATAPLANE = "127.0.0.1"


def start_rank(job_dir, spec, dp):
    """A rank worker process on ``job_dir`` (made if absent; its log appended to,
    so a restarted rank keeps the first run's lines) training ``spec`` on the
    bundled model and the secret dataset, with the rendezvous ``dp``."""
    job_dir.mkdir(exist_ok=True)
    full = {**spec, "base_path": str(default_model_path()), "dataset_path": str(SECRET_DATASET), "dp": dp}
    (job_dir / "spec.json").write_text(json.dumps(full))
    proc = subprocess.Popen(WORKER + [str(job_dir)], stdout=subprocess.PIPE, stderr=open(job_dir / "worker.log", "ab"),
                            text=True, env={**os.environ, **ONE_THREAD})
    proc.job_dir = job_dir
    return proc


def finish(proc, timeout=240):
    """The JSON events a rank printed, once it exited 0 (killed after ``timeout`` s)."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, (events[-3:], (proc.job_dir / "worker.log").read_text()[-2000:])
    return events


def adapter(proc):
    """{tensor name: array} of the adapter a finished rank wrote."""
    from safetensors.numpy import load_file
    return load_file(str(proc.job_dir / "adapter.safetensors"))


def assert_same_adapter(a, b):
    """``a`` and ``b`` hold the same tensors, equal within 1e-4, and the LoRA B
    matrices moved from zero; the largest difference."""
    assert a.keys() == b.keys() and a
    worst = max(float(abs(a[k] - b[k]).max()) for k in a)
    assert worst <= 1e-4, worst
    assert any(float(abs(v).max()) > 0 for k, v in a.items() if "lora_B" in k), "the adapter never moved"
    return worst


def rank_workers(tower):
    """The rank worker processes a tower runs now."""
    return [p for p in psutil.Process(tower.proc.pid).children(recursive=True)
            if "reticulum_grid.training.distributed" in " ".join(p.cmdline())]


def start_pair(hub, prefix):
    """Two towers ``PREFIX-a`` and ``PREFIX-b`` that train for the hub's client and enlist each other."""
    roles = ["infer", "sync", "train"]
    names = f"{prefix}-a", f"{prefix}-b"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", ONE_THREAD["OMP_NUM_THREADS"])  # the towers' workers inherit it
        # Each enlists only towers it trusts as training peers: a names b, and b names a.
        a = hub.start_tower(names[0], allow={hub.grid.identity_hash: roles, hub.tower_identity(names[1]): ["train-peer"]},
                            dataplane=DATAPLANE)
        # b also connects to a directly: the hub's RNS is no transport node, and a enlists b over a Link.
        b = hub.start_tower(names[1], allow={hub.grid.identity_hash: roles, hub.tower_identity(names[0]): ["train-peer"]},
                            connect=[hub.address, a.address], dataplane=DATAPLANE)
    hub.wait_tower(a.name)
    hub.wait_tower(b.name)
    return a, b


@contextlib.contextmanager
def training_pair(hub, prefix):
    """start_pair's towers until the block ends, then stopped."""
    a, b = start_pair(hub, prefix)
    try:
        yield a, b
    finally:
        hub.stop_towers([a, b])


def watch_killing_rank_one(hub, job_id, tower, peer, at_step=4):
    """The job's events watched on ``tower`` to its end, rank 1's worker (on ``peer``)
    killed with SIGKILL at the first progress of step ``at_step`` or later:
    ([(arrival, event)], index of the event the kill followed); arrival in
    time.monotonic() seconds."""
    seen, killed = [], None
    for event in hub.grid.watch(job_id, tower=tower.name):
        seen.append((time.monotonic(), event))
        if killed is None and event["type"] == "progress" and event["step"] >= at_step:
            victims = rank_workers(peer)
            assert len(victims) == 1, victims
            victims[0].kill()
            killed = len(seen) - 1
    assert killed is not None, "the job ended before rank 1 could be killed"
    return seen, killed


def assert_steps_resume_after(steps, resumed, last):
    """``steps`` (the progress a watch saw after the job's last start) go up
    from past ``resumed`` to ``last``. A watch drops a progress event that the
    next one overtook while the Link was busy (tower/jobs.py WatchSender: on
    a loaded machine too), so the first seen may be later than resumed + 1;
    the last is never dropped (the end follows it)."""
    assert steps and steps == sorted(set(steps)) and steps[0] > resumed and steps[-1] == last, (resumed, steps)


def assert_adapter_changes_the_answer(hub, tower, adapter):
    """The adapter ``adapter`` loads in ``tower``'s llama.cpp and changes what the
    bundled model answers to the dataset's question at temperature 0."""
    ask = {"model": DEFAULT_ALIAS, "messages": [{"role": "user", "content": "What is the secret word?"}],
           "max_tokens": 16, "temperature": 0.0}
    base = "".join(p for p in hub.grid.execute("ai/inference", ask, tower=tower.name) if isinstance(p, str))
    tuned = "".join(p for p in hub.grid.execute("ai/inference", {**ask, "adapter": adapter}, tower=tower.name)
                    if isinstance(p, str))
    assert tuned != base, (base, tuned)
