"""The paths that only a GPU can run, on a real one: every test here is marked
``gpu`` (registered in pyproject.toml) and needs an NVIDIA GPU, and this is
the one module that holds them. Elsewhere they skip (a GPU cannot be
installed, so not even RNGRID_REQUIRE_ALL=1 fails them); bench/gpu_check.sh
runs them with ``pytest -m gpu`` after its llama.cpp CUDA build, with a
random-weight model of the bundled one's shape standing in for it
(RNGRID_DEFAULT_MODEL: no model travels to that machine). What a GPU would report is
covered without one in tests/inference/test_gpu.py, on named test doubles; here nothing
is faked.

- GPU offload accounting: a tower on the GPU says cuda, holds the bundled model
  offloaded, and measures the VRAM the load took (caps/full ``vram_mib``),
  which its estimate (``need_mib``) is never below.
- fp16 with a loss scaler: the training worker on a GPU told that it has no
  bf16 (as a pre-Ampere card answers) trains in fp16, and the adapter moves.
- NCCL data parallel (two GPUs): two ranks, one GPU each, train the same
  adapter as one rank.
"""

import json
import math
import os
import secrets
import subprocess
import sys

import pytest

from announce.caps import decode_full
from reticulum_grid.inference.default_model import default_model_path
from testbed.requirements import needs
from testbed import SECRET_DATASET as DATA

pytestmark = [pytest.mark.gpu, needs("gpu", "these are the GPU paths")]

SPEC = {"rank": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"], "learning_rate": 4e-3,
        "max_steps": 12, "seq_len": 48, "batch_size": 4, "seed": 1, "checkpoint_every": 100,
        "output_alias": "gpu-test"}


def test_a_cuda_tower_offloads_the_model_and_accounts_its_vram(hub):
    tower = hub.start_tower("gpu-tower", models={"gpu-smol": default_model_path()})
    try:
        entry = hub.wait_tower(tower.name, timeout=120)
        reply = hub.grid.connection(entry).request("caps/full", {}, 60)
        hw = decode_full(reply["caps"]).hardware
        assert hw.backend == "cuda" and hw.gpus >= 1 and hw.vram_total_mib > 0, hw
        model = next(b for b in reply["blobs"] if b.get("kind") == "model" and b.get("loaded"))
        print(f"placement: {json.dumps({k: model.get(k) for k in ('on_gpu', 'gpu_mib', 'host_mib', 'vram_mib', 'need_mib')})}")
        assert model["on_gpu"] and model["gpu_mib"] > 0, model
        # The VRAM the load took, as the GPUs show it, and an estimate never below it.
        assert model["vram_mib"] is not None and model["vram_mib"] > 0, model
        assert model.get("need_mib") is None or model["need_mib"] >= model["vram_mib"], model
        pieces = list(hub.grid.execute("ai/inference", {"model": "gpu-smol", "prompt": "Count: 1, 2, 3,",
                                                        "max_tokens": 16, "temperature": 0.0}, tower=tower.name))
        assert pieces[-1].completion_tokens == 16 and pieces[-1].tower == tower.name
    finally:
        tower.stop()


class EventLog:
    """Collects the training worker's events in this process (what trainer.Events
    writes to stdout as JSON lines)."""

    def __init__(self):
        self.events = []

    def emit(self, kind, **fields):
        self.events.append({"event": kind, **fields})


def test_fp16_training_with_a_loss_scaler_on_a_gpu_without_bf16(tmp_path, monkeypatch):
    import torch
    from safetensors.numpy import load_file

    from reticulum_grid.training import trainer

    # What a pre-Ampere GPU answers; everything else is this GPU's real arithmetic.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    scaled = []
    original = torch.amp.GradScaler.scale
    monkeypatch.setattr(torch.amp.GradScaler, "scale", lambda self, outputs: scaled.append(1) or original(self, outputs))
    spec = {**SPEC, "base_path": str(default_model_path()), "dataset_path": str(DATA)}
    log = EventLog()
    trainer.run(tmp_path, spec, log)
    started = next(e for e in log.events if e["event"] == "started")
    assert started["device"].startswith("cuda") and started["precision"] == "fp16", started
    losses = [e["loss"] for e in log.events if e["event"] == "step"]
    assert len(losses) == SPEC["max_steps"] and all(math.isfinite(x) for x in losses), losses
    assert len(scaled) == SPEC["max_steps"], "every step's loss went through the scaler"
    adapter = load_file(str(tmp_path / trainer.ADAPTER))
    assert all(not (abs(v) == float("inf")).any() and not (v != v).any() for v in adapter.values()), "inf/NaN weights"
    assert any(abs(v).max() > 0 for k, v in adapter.items() if "lora_B" in k), "the adapter never moved"
    print(f"fp16 losses {losses}")


def dp_worker(tmp, name, dp, gpu):
    job_dir = tmp / name
    job_dir.mkdir()
    spec = {**SPEC, "base_path": str(default_model_path()), "dataset_path": str(DATA), "dp": dp}
    (job_dir / "spec.json").write_text(json.dumps(spec))
    return subprocess.Popen([sys.executable, "-m", "reticulum_grid.training.distributed", str(job_dir)],
                            stdout=subprocess.PIPE, stderr=open(job_dir / "worker.log", "wb"), text=True,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)})


@needs("2-gpus", "NCCL puts one rank on each GPU")
def test_nccl_two_ranks_train_the_same_adapter_as_one(tmp_path):
    from reticulum_grid.training import rendezvous
    port = rendezvous.free_port("127.0.0.1")
    dp = {"world_size": 2, "units": 2, "host": "127.0.0.1", "dataplane": "127.0.0.1", "port": port,
          "peers": ["127.0.0.1"], "secret": secrets.token_hex(32)}
    procs = [dp_worker(tmp_path, "rank0", {**dp, "rank": 0}, 0), dp_worker(tmp_path, "rank1", {**dp, "rank": 1}, 1)]
    try:
        outs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], [(tmp_path / f"rank{k}" / "worker.log").read_text()[-2000:]
                                                    for k in (0, 1)]
    one = dp_worker(tmp_path, "one", {**dp, "world_size": 1, "rank": 0, "port": rendezvous.free_port("127.0.0.1")}, 0)
    single = one.communicate(timeout=600)[0]
    assert one.returncode == 0, (tmp_path / "one" / "worker.log").read_text()[-2000:]
    events = [json.loads(line) for line in outs[0].splitlines() if line.startswith("{")]
    started = next(e for e in events if e["event"] == "started")
    assert started["world_size"] == 2 and started["device"].startswith("cuda"), started
    two = [e["loss"] for e in events if e["event"] == "step"]
    alone = [json.loads(line)["loss"] for line in single.splitlines()
             if line.startswith("{") and json.loads(line)["event"] == "step"]
    print(f"losses on 2 GPUs {two}, on 1 {alone}")
    # The same arithmetic up to the GPUs' reduction order (bf16 weights): close, not equal.
    assert len(two) == len(alone) == SPEC["max_steps"] and max(abs(a - b) for a, b in zip(two, alone)) < 0.05
