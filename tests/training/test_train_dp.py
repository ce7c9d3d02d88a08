"""Data-parallel LoRA over several towers: real worker processes on gloo (CPU),
the real SmolLM2 GGUF, torch.distributed's real TCPStore behind our front,
real towers over RNS for dispatch, fault and refusal."""

import json
import secrets
import socket
import subprocess
import sys
import time

import psutil
import pytest

from links.wire import Code, WireError
from reticulum_grid.inference.default_model import DEFAULT_ALIAS
from reticulum_grid.node.connection import TowerConnection
from reticulum_grid.node.identity import load_or_create
from reticulum_grid.node.localgrid import wait_port
from reticulum_grid.client.training import train_towers
from reticulum_grid.training import distributed, rendezvous
from tests.conftest import rngrid
from tests.training.ranks import (DATAPLANE, JOB, adapter, assert_adapter_changes_the_answer, assert_same_adapter,
                                  assert_steps_resume_after, finish, rank_workers, start_rank, training_pair,
                                  watch_killing_rank_one)
from testbed import SECRET_DATASET as DATA

SPEC = {"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"], "learning_rate": 4e-3,
        "max_steps": 3, "seq_len": 32, "batch_size": 4, "seed": 1, "checkpoint_every": 100,
        "output_alias": "dp-test"}


def worker(tmp, name, dp):
    return start_rank(tmp / name, SPEC, dp)


def listening_ips(pid):
    try:
        return {c.laddr.ip for c in psutil.Process(pid).net_connections(kind="inet") if c.status == "LISTEN"}
    except psutil.Error:
        return set()


def closed_on_us(s):
    """True when the peer closes (or resets) the connection rather than answering."""
    try:
        return s.recv(64) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:  # still open: it was let through
        return False


def intruders(port):
    """Connections that do not know the secret, as an outsider would try them.
    Returns what each saw (seconds until the front closed on it)."""
    seen = {}
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # a wrong answer
        begun = time.monotonic()
        s.recv(64)
        s.sendall(b"\0" * rendezvous.MAC_BYTES + b"set key value\n")
        seen["wrong_answer_closed_s"] = time.monotonic() - begun if closed_on_us(s) else None
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # silence
        begun = time.monotonic()
        s.recv(64)
        seen["silent_closed_s"] = time.monotonic() - begun if closed_on_us(s) else None
    import torch.distributed as dist
    from datetime import timedelta
    try:  # torch's own store client, straight at the front
        dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timedelta(seconds=3))
        seen["tcpstore_client"] = "joined"
    except dist.DistError as e:  # torch's store and network errors only: a crash of ours is no refusal
        seen["tcpstore_client"] = f"refused: {type(e).__name__}: {e}"
    return seen


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One job on 2 ranks (attacked before rank 1 joins) and the same job on 1 rank."""
    tmp = tmp_path_factory.mktemp("dp")
    port = rendezvous.free_port("127.0.0.1")
    dp = {"world_size": 2, "units": 2, "host": "127.0.0.1", "dataplane": "127.0.0.1", "port": port,
          "secret": secrets.token_hex(32), "peers": ["127.0.0.1"]}
    procs = [worker(tmp, "rank0", {**dp, "rank": 0})]
    try:
        assert wait_port(port, 120), "rank 0's store front never listened"
        seen = intruders(port)
        procs.append(worker(tmp, "rank1", {**dp, "rank": 1}))
        procs.append(worker(tmp, "one", {**dp, "world_size": 1, "rank": 0}))
        ips, deadline = set(), time.monotonic() + 600
        while procs[0].poll() is None and time.monotonic() < deadline:
            ips |= listening_ips(procs[0].pid)
            time.sleep(0.2)
        events = [finish(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        closed = False
    except OSError:
        closed = True
    return {"two": events[0], "rank1": events[1], "one": events[2], "seen": seen, "ips": ips, "closed": closed,
            "adapters": (adapter(procs[0]), adapter(procs[2]))}


def test_two_ranks_train_the_same_adapter_as_one(runs):
    two = [e["loss"] for e in runs["two"] if e["event"] == "step"]
    one = [e["loss"] for e in runs["one"] if e["event"] == "step"]
    assert len(two) == len(one) == SPEC["max_steps"]
    assert max(abs(a - b) for a, b in zip(two, one)) <= 1e-4, (two, one)
    worst = assert_same_adapter(*runs["adapters"])
    print(f"max abs adapter difference 2 ranks vs 1: {worst:.3g}; losses {two} vs {one}")
    started = next(e for e in runs["two"] if e["event"] == "started")
    assert started["world_size"] == 2 and started["grad_bytes"] > 0 and started["allreduce_s"] > 0
    step = next(e for e in runs["two"] if e["event"] == "step")
    assert [r["rank"] for r in step["ranks"]] == [0, 1] and all(r["samples_per_s"] > 0 for r in step["ranks"])
    assert not [e for e in runs["rank1"] if e["event"] in ("step", "done")], "only rank 0 speaks for the job"


def test_a_store_connection_without_the_secret_joins_nothing(runs):
    seen = runs["seen"]
    print(f"refusals measured: {seen}")
    # A wrong answer is closed on at once, well before the timeout a silent one waits out.
    assert seen["wrong_answer_closed_s"] is not None and seen["wrong_answer_closed_s"] < rendezvous.AUTH_TIMEOUT_S / 2
    assert seen["silent_closed_s"] is not None and seen["silent_closed_s"] >= rendezvous.AUTH_TIMEOUT_S - 0.1
    assert seen["silent_closed_s"] <= rendezvous.AUTH_TIMEOUT_S + 5
    # torch's client read the front's challenge where it expected the store's answer to its
    # ping (the greeting's first 4 bytes, read as a little-endian int), and gave up.
    greeting = int.from_bytes(rendezvous.GREETING[:4], "little")
    assert seen["tcpstore_client"].startswith("refused: DistNetworkError") and f"Got: {greeting}" in \
        seen["tcpstore_client"], seen["tcpstore_client"]
    front = next(e for e in runs["two"] if e["event"] == "done")["store_front"]
    assert front["refused"] >= 3 and front["admitted"] >= 1, front
    # The job was unharmed (it trained as the 1-rank run did: the test above), nothing
    # listened beyond loopback, and the port closed with the job.
    assert runs["ips"] and runs["ips"] <= {"127.0.0.1"}, runs["ips"]
    assert runs["closed"]


# -- over RNS: dispatch, a lost rank, refusals -----------------------------------

@pytest.fixture(scope="module")
def pair(hub):
    with training_pair(hub, "dp") as towers:
        yield towers


@pytest.mark.timeout(600)
def test_a_killed_rank_resumes_on_the_towers_left(hub, pair, tmp_path):
    a, b = pair
    entry, job_id = hub.grid.train(dict(JOB), data_path=DATA, towers=[a.name, b.name])
    assert entry.name == a.name
    seen, kill = watch_killing_rank_one(hub, job_id, a, b)
    events = [event for _, event in seen]
    before = {e["step"]: e["loss"] for e in events[:kill + 1] if e["type"] == "progress"}
    assert all(len(e["ranks"]) == 2 for e in events[:kill + 1] if e["type"] == "progress")
    killed_at = seen[kill][0]
    requeued_at = next(t for t, e in seen[kill:] if e["type"] == "state" and e["state"] == "queued")
    end = events[-1]
    started = [e for e in events if e["type"] == "started"]
    print(f"rank 1 killed; the job went back to the queue {requeued_at - killed_at:.1f} s later; "
          f"history {end['history']}")
    assert end["state"] == "succeeded" and end["error"] is None, end
    # A lost rank is noticed when a collective times out (COLLECTIVE_TIMEOUT_S), then the job requeues.
    assert requeued_at - killed_at <= distributed.COLLECTIVE_TIMEOUT_S + 60
    assert [s["world_size"] for s in started] == [2, 1]
    resumed = started[-1]["resumed_from"]
    assert resumed in (3, 6) and resumed < max(before)
    after = [e for e in events if e["type"] == "progress" and events.index(e) > events.index(started[-1])]
    assert_steps_resume_after([e["step"] for e in after], resumed, JOB["max_steps"])
    assert all(len(e["ranks"]) == 1 for e in after)
    # Same units, same arithmetic: the steps redone on one rank repeat the 2-rank losses.
    redone = {e["step"]: e["loss"] for e in after if e["step"] in before}
    assert redone and all(abs(redone[k] - before[k]) <= 1e-4 for k in redone), (before, redone)
    assert any("collective" in h for h in end["history"]) and any("1 rank(s)" in h for h in end["history"])
    job = next(j for _, j in hub.grid.jobs(a.name) if j["id"] == job_id)
    assert job["error"] is None and job["history"] == end["history"]
    assert not [j for _, j in hub.grid.jobs(b.name) if j["id"] == job_id], "a participant keeps no job row"

    # One notification, from rank 0's tower.
    home = tmp_path / "inbox"
    home.mkdir()
    (home / "identity").write_bytes((hub.grid.home / "identity").read_bytes())
    inbox = subprocess.run([sys.executable, "-m", "reticulum_grid", "--home", str(home), "inbox", "--wait", "15",
                            "--json", "--connect", a.address, "--connect", b.address],
                           capture_output=True, text=True, timeout=90)
    notes = [n for n in map(json.loads, inbox.stdout.splitlines()) if job_id in n["title"]]
    assert len(notes) == 1 and "succeeded" in notes[0]["title"], (notes, inbox.stderr[-1500:])

    # The adapter loads in llama.cpp and changes what the model says.
    assert_adapter_changes_the_answer(hub, a, "dp-lora")


def test_a_participant_without_train_is_refused(hub, pair):
    a, b = pair
    c = hub.start_tower("dp-c", roles=("infer", "sync"), dataplane=DATAPLANE)
    hub.wait_tower(c.name)
    with pytest.raises(WireError) as e:
        hub.grid.train(dict(JOB), data_path=DATA, towers=[a.name, c.name])
    assert e.value.code == Code.NOT_ALLOWED and c.name in e.value.message
    join = {"job_id": "x", "owner": hub.grid.identity_hash, "check": True, "spec": {}}
    with pytest.raises(WireError) as e:  # the tower itself refuses an identity without train
        hub.grid.execute("train/join", join, tower=c.name)
    assert e.value.code == Code.NOT_ALLOWED and "train" in e.value.message
    as_a = TowerConnection(load_or_create(a.dir / "identity"), hub.wait_tower(b.name).destination_hash, "as dp-a")
    with pytest.raises(WireError) as e:  # and a job whose owner may not train there (asked by b's training peer)
        as_a.request("train/join", {**join, "job_id": "0123456789ab", "owner": "ab" * 16}, timeout=20)
    assert e.value.code == Code.NOT_ALLOWED and "owner" in e.value.message
    as_a.close()


def test_a_coordinator_gives_its_secret_only_to_towers_it_trusts(hub, pair):
    """The user names the towers; rank 0 enlists only those holding train-peer on its own allow-list:
    one that would gladly join (it grants dp-a train-peer, the user train) but dp-a does not list is
    left out, asked nothing, and the job runs without it."""
    a, _ = pair
    d = hub.start_tower("dp-d", allow={hub.grid.identity_hash: ["infer", "sync", "train"],
                                       hub.tower_identity("dp-a"): ["train-peer"]},
                        connect=[hub.address, a.address], dataplane=DATAPLANE)
    hub.wait_tower(d.name)
    entry, job_id = hub.grid.train({**JOB, "max_steps": 2, "output_alias": "dp-untrusted"}, data_path=DATA,
                                   towers=[a.name, d.name])
    events = list(hub.grid.watch(job_id, tower=a.name))
    end = events[-1]
    assert end["state"] == "succeeded", end
    assert [e["world_size"] for e in events if e["type"] == "started"] == [1]
    destination = hub.wait_tower(d.name).destination_hash.hex()
    assert any(f"{destination[:8]} left out: not_allowed" in h and "not trusted by dp-a" in h
               and f"rngrid allow {hub.tower_identity('dp-d')} --role train-peer" in h for h in end["history"]), end
    assert f"job {job_id}: rank" not in d.log() and not rank_workers(d)
    hub.stop_towers([d])


def test_auto_n_takes_only_trusted_towers_that_grant_train(hub, pair, tmp_path):
    """`--towers auto:N` picks among the towers this client trusts that grant it train and
    have a data plane: a stranger offering both is heard and never counted."""
    a, b = pair
    stranger = hub.start_tower("dp-stranger", roles=("infer", "sync", "train"), dataplane=DATAPLANE, trusted=False)
    assert hub.grid.wait_for(lambda _: any(e.name == stranger.name for e in hub.grid.table.strangers()), 60)
    assert sorted(e.name for e in train_towers(hub.grid, "auto:2")) == ["dp-a", "dp-b"]
    home = tmp_path / "laptop"
    home.mkdir()
    (home / "identity").write_bytes((hub.grid.home / "identity").read_bytes())
    asked = rngrid("train", "--towers", "auto:3", "--base", DEFAULT_ALIAS, "--data", str(DATA), "--output", "never",
                   "--connect", a.address, "--connect", b.address, "--connect", stranger.address, home=home)
    assert asked.returncode == 1, asked.stderr
    assert "no_tower: 2 tower(s) heard grant this identity train" in asked.stderr, asked.stderr
