"""``train/join`` is a tower-to-tower command (tower/dp.py), and nothing from the
network is unpickled (training/checkpoint.py).

A real tower offering multi-tower training; the attacker is a client holding
``infer``, ``train`` and ``sync`` there (the hub), a training peer is a tower
identity granted ``train-peer``. The attack as it was: the client sends
``train/join`` itself, with a job id that climbs out of the tower's home and
the address and secret of a process it runs, so the tower starts a rank that
joins the attacker's job and unpickles what it sends.
"""

import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import RNS

from links.wire import Code, WireError
from reticulum_grid.node.connection import TowerConnection
from reticulum_grid.training import checkpoint
from tests.training.ranks import rank_workers  # the tower's training ranks, found the same way
from testbed import SECRET_DATASET as DATA

ROOT = Path(__file__).resolve().parents[2]
DATAPLANE = "127.0.0.1"
SPEC = {"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj"], "learning_rate": 1e-3, "max_steps": 2,
        "seq_len": 16, "batch_size": 2, "seed": 1, "checkpoint_every": 10, "output_alias": "tp-out"}


class Peers:
    """Two tower identities this tower trusts as training peers (they need not run a tower here)."""
    first, second = RNS.Identity(), RNS.Identity()


class Listener:
    """The attacker's process: a TCP listener that counts who connects."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()


@pytest.fixture(scope="module")
def tower(hub):
    allow = {hub.grid.identity_hash: ["infer", "train", "sync"],
             Peers.first.hash.hex(): ["train-peer"], Peers.second.hash.hex(): ["train-peer"]}
    t = hub.start_tower("tp-b", allow=allow, dataplane=DATAPLANE, blobs=[(DATA, "tp-data", "dataset", True)])
    entry = hub.wait_tower(t.name)
    (_, full), = hub.grid.caps_full([entry], timeout=60)
    blobs = {b.kind: b.hex for b in full.blobs}
    yield t, entry, {**SPEC, "base_blob": blobs["model"], "dataset_blob": blobs["dataset"]}
    t.stop()


def join(spec, job_id, port, check=False):
    return {"job_id": job_id, "owner": RNS.Identity().hash.hex(), "check": check, "spec": spec, "rank": 1,
            "world_size": 2, "units": 2, "host": "127.0.0.1", "port": port, "secret": "ab" * 32}


def test_a_client_with_train_cannot_enlist_a_tower(hub, tower):
    t, entry, spec = tower
    attacker = Listener()
    request = {**join(spec, "../../../escaped_job", attacker.port), "owner": hub.grid.identity_hash}
    with pytest.raises(WireError) as e:
        hub.grid.execute("train/join", request, tower=t.name)
    print(f"train/join from a client holding infer+train+sync: {e.value.code}: {e.value.message[:120]}")
    assert e.value.code == Code.NOT_ALLOWED and "train-peer" in e.value.message
    # A rank starts inside the handler, before its reply: after a refusal, the tower's record and its
    # processes show whether one did (no waiting for something that may come later).
    assert "escaped_job: rank" not in t.log() and not rank_workers(t), rank_workers(t)
    assert not (t.dir.parent / "escaped_job").exists() and not list(t.dir.parent.glob("**/escaped_job"))
    assert attacker.connections == 0, "a rank connected to the attacker's process"


def test_a_training_peer_gets_job_ids_checked_and_only_its_own_jobs(hub, tower):
    t, entry, spec = tower
    first = TowerConnection(Peers.first, entry.destination_hash, "peer 1")
    second = TowerConnection(Peers.second, entry.destination_hash, "peer 2")
    listener = Listener()
    try:
        for bad in ("../../../escaped_job", "abc", "0123456789AB", "0123456789ab/.."):
            with pytest.raises(WireError) as e:
                first.request("train/join", {**join(spec, bad, listener.port), "owner": hub.grid.identity_hash},
                              timeout=20)
            assert e.value.code == Code.BAD_REQUEST and "job id" in e.value.message, bad
        reply = first.request("train/join", {**join(spec, "0123456789ab", listener.port),
                                             "owner": hub.grid.identity_hash}, timeout=20)
        assert reply["ready"]
        ranks = t.dir / "jobs" / "ranks"
        (job_dir,) = ranks.iterdir()
        assert job_dir.name == f"{Peers.first.hash.hex()}-0123456789ab"
        assert (job_dir / "spec.json").stat().st_mode & 0o777 == 0o600, "the spec holds the job's secret"
        assert json.loads((job_dir / "spec.json").read_text())["dp"]["secret"] == "ab" * 32
        # Another peer naming the same job id reaches a job of its own, never the first peer's rank.
        with pytest.raises(WireError) as e:
            second.request("train/join", {**join(spec, "0123456789ab", listener.port),
                                          "owner": hub.grid.identity_hash}, timeout=20)
        assert e.value.code == Code.BUSY  # this tower trains for peer 1 now; peer 1's rank is untouched
        assert [p.name for p in ranks.iterdir()] == [job_dir.name]
    finally:
        first.close()
        second.close()


def test_nothing_in_the_packages_unpickles():
    pattern = re.compile(r"\bpickle\b|cPickle|broadcast_object_list|recv_object_list|all_gather_object|"
                         r"gather_object|scatter_object_list|weights_only\s*=\s*False|torch\.load\(|allow_pickle")
    hits = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for folder in ("reticulum_grid", "announce", "links")
            for path in (ROOT / folder).rglob("*.py") for n, line in enumerate(path.read_text().splitlines(), 1)
            if pattern.search(line) and not line.lstrip().startswith("#") and path.name != "checkpoint.py"]
    assert not hits, "\n".join(hits)
    # checkpoint.py names pickle only to say why it is not used
    text = (ROOT / "reticulum_grid" / "training" / "checkpoint.py").read_text()
    assert "import pickle" not in text and "torch.load" not in text and "weights_only=False" not in text


def test_checkpoints_hold_only_tensors_and_tagged_values():
    import torch

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    state = {"adapter": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": torch.get_rng_state(),
             "step": 7}
    back = checkpoint.unpack(checkpoint.pack(state))
    assert back["step"] == 7 and torch.equal(back["rng"], state["rng"])
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert set(back["optimizer"]["state"]) == {0, 1} and torch.equal(back["adapter"]["weight"], model.weight)
    from safetensors.torch import save
    for tree in ('{"x": 1}', '{"v": {"__reduce__": "os.system"}}', '{"t": "missing"}', '{"d": [[{"l": []}, {"v": 1}]]}'):
        with pytest.raises(checkpoint.CheckpointError):
            checkpoint.unpack(save({}, metadata={"tree": tree}))
    with pytest.raises(checkpoint.CheckpointError):
        checkpoint.unpack(b"\x80\x04\x95 a pickle")


RANK = """
import json, os, sys, torch, torch.distributed as dist
from datetime import timedelta
from reticulum_grid.training import checkpoint, distributed
rank, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=timedelta(seconds=60))
dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
torch.manual_seed(5)
state = {"rng": torch.get_rng_state(), "step": 3, "w": torch.arange(6.0).reshape(2, 3)} if rank == 0 else None
data = distributed.broadcast_bytes(checkpoint.pack(state) if rank == 0 else b"", rank)
got = checkpoint.unpack(data)
json.dump({"step": got["step"], "w": got["w"].tolist(), "rng": got["rng"].sum().item()}, open(out, "w"))
dist.destroy_process_group()  # gloo's threads end before the interpreter does (else, at times: "terminate called")
"""


def test_a_checkpoint_crosses_between_ranks_as_bytes_in_a_tensor(tmp_path):
    port = socket.create_server(("127.0.0.1", 0)).getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(port), str(tmp_path / f"{r}.json")], cwd=ROOT,
                              env={**os.environ, "OMP_NUM_THREADS": "1"}) for r in (0, 1)]
    for p in procs:
        assert p.wait(180) == 0
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    assert got[0] == got[1] and got[1]["step"] == 3 and got[1]["w"] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
