"""Who may read what on a real tower: a stranger, identities with some roles,
an admin. Datasets never leak; one owner never sees or stops another's job;
a broken tower.toml grants nobody anything.

Each identity is its own Link from this process (TowerConnection with its own
RNS Identity), so the tower sees four different clients."""

import os

import pytest
import RNS

from links import manifest as mf
from links.wire import Code, WireError
from reticulum_grid.inference.default_model import DEFAULT_ALIAS
from reticulum_grid.node.connection import TowerConnection, wait_until
from reticulum_grid.tower.jobs import MAX_QUEUED_PER_OWNER
from testbed.leftovers import alive, descendants
from testbed.requirements import need
from testbed import SECRET_DATASET as DATA

JOB = {"base": DEFAULT_ALIAS, "dataset": "secret-data", "output_alias": "own-lora", "rank": 4, "alpha": 8.0,
       "target_modules": ["q_proj", "v_proj"], "learning_rate": 1e-3, "max_steps": 5000, "seq_len": 64,
       "batch_size": 1, "seed": 1, "checkpoint_every": 1000}


class Who:
    """The identities of this module and their roles on the tower."""
    owner, other, admin, stranger = (RNS.Identity() for _ in range(4))
    roles = {"owner": ["sync", "train"], "other": ["train"], "admin": ["admin"]}


@pytest.fixture(scope="module")
def tower(hub):
    allow = {getattr(Who, name).hash.hex(): roles for name, roles in Who.roles.items()}
    t = hub.start_tower("own-a", allow=allow, blobs=[(DATA, "secret-data", "dataset", True)])
    hub.wait_tower(t.name)
    yield t
    t.stop()


@pytest.fixture(scope="module")
def conns(hub, tower):
    dest = hub.wait_tower(tower.name).destination_hash
    made = {name: TowerConnection(getattr(Who, name), dest, name) for name in ("owner", "other", "admin", "stranger")}
    yield made
    for conn in made.values():
        conn.close()


def refused(call):
    with pytest.raises(WireError) as e:
        call()
    assert e.value.code == Code.NOT_ALLOWED, e.value
    return e.value.message


def stranger_words(conn):
    return f"identity {conn.identity.hash.hex()} is not on this tower's allow-list"


# -- datasets ------------------------------------------------------------------
def test_the_grants_took_effect(conns):
    # Before any refusal counts: the tower knows each identity with its roles.
    for name, roles in Who.roles.items():
        you = conns[name].request("caps/full", {})["you"]
        assert set(roles) <= set(you["roles"]) and (name == "admin" or you["roles"] == sorted(roles)), name
    assert conns["stranger"].request("caps/full", {})["you"]["roles"] == []
    reply = conns["owner"].request("blobs/manifest", {"name": "secret-data"})
    m = mf.unpack(reply["manifest"], expected_id=reply["blob_id"])
    assert b"".join(d for _, d in conns["owner"].fetch(reply["blob_id"], m, range(len(m.chunks)))) == DATA.read_bytes()


def test_caps_full_hides_datasets_from_strangers(conns):
    kinds = {b["alias"]: b["kind"] for b in conns["owner"].request("caps/full", {})["blobs"]}
    assert kinds.get("secret-data") == "dataset"
    seen = {b["alias"]: b["kind"] for b in conns["stranger"].request("caps/full", {})["blobs"]}
    assert "secret-data" not in seen and "dataset" not in seen.values() and seen, seen


def test_a_stranger_reads_no_dataset(conns):
    stranger = conns["stranger"]
    m = mf.build(DATA)
    message = refused(lambda: stranger.request("blobs/manifest", {"name": "secret-data"}))
    assert stranger_words(stranger) in message
    message = refused(lambda: stranger.request("blobs/manifest", {"name": m.blob_id.hex()}))
    assert stranger_words(stranger) in message
    message = refused(lambda: list(stranger.fetch(m.blob_id, m, [0])))  # Channel chunk reads
    assert stranger_words(stranger) in message
    message = refused(lambda: stranger.request("blobs/pull", {"name": "secret-data", "sources": [b"\x01" * 16],
                                                              "xfer_id": 3}))
    assert stranger_words(stranger) in message


def test_an_identity_without_sync_reads_no_dataset(conns):
    other = conns["other"]
    m = mf.build(DATA)
    for call in (lambda: other.request("blobs/manifest", {"name": "secret-data"}),
                 lambda: list(other.fetch(m.blob_id, m, [0]))):
        message = refused(call)
        assert "not allowed to sync" in message and "(it may: train)" in message
        assert "not on this tower's allow-list" not in message


# -- a broken tower.toml ------------------------------------------------------------
def test_a_broken_config_keeps_the_last_good_allow_list(tower, conns):
    good = tower.config_path.read_text()
    stranger = conns["stranger"]
    # It even tries to grant the stranger everything; it does not parse, so nothing changes.
    broken = good + f'\n"{stranger.identity.hash.hex()}" = ["admin"]\n[[[ this is not TOML\n'
    try:
        for damage in ("broken", "missing"):
            if damage == "broken":
                tower.config_path.write_text(broken)
            else:
                tower.config_path.unlink()
            assert conns["owner"].request("blobs/manifest", {"name": "secret-data"})["kind"] == "dataset", damage
            assert stranger_words(stranger) in refused(
                lambda: stranger.request("blobs/manifest", {"name": "secret-data"})), damage
            assert stranger.request("caps/full", {})["you"]["roles"] == [], damage
        log = tower.log()
        assert log.count("allow-list not reloaded") >= 2, log[-2000:]
    finally:
        tower.config_path.write_text(good)
    assert conns["owner"].request("blobs/manifest", {"name": "secret-data"})["kind"] == "dataset"


# -- jobs ---------------------------------------------------------------------
def job_state(conn, job_id):
    return conn.request("jobs/status", {"job_id": job_id})["jobs"][0]["state"]


def wait_state(conn, job_id, state, timeout=60.0):
    assert wait_until(lambda: job_state(conn, job_id) == state, timeout, poll_s=0.3), \
        f"job {job_id} is {job_state(conn, job_id)}, not {state}, after {timeout:.0f} s"


@pytest.fixture(scope="module")
def jobs(conns, tower):
    need("peft", "the jobs train LoRA adapters")
    owner = conns["owner"]
    first = owner.request("genome/train", dict(JOB))["job_id"]
    second = owner.request("genome/train", dict(JOB, output_alias="own-lora-2"))["job_id"]
    yield first, second
    if tower.proc.poll() is not None:
        return  # the last test killed the tower, and its worker with it
    try:  # the last test did not run: end the jobs here
        for job in conns["admin"].request("jobs/status", {}, timeout=5)["jobs"]:
            if job["state"] in ("queued", "running"):
                conns["admin"].request("jobs/cancel", {"job_id": job["id"]}, timeout=5)
    except WireError:
        pass


def test_one_job_runs_at_a_time(conns, jobs):
    first, second = jobs
    wait_state(conns["owner"], first, "running")
    assert job_state(conns["owner"], second) == "queued"


def test_another_owner_cannot_see_watch_or_cancel_a_job(conns, jobs):
    first, _ = jobs
    other = conns["other"]
    for path, payload in (("jobs/status", {"job_id": first}), ("jobs/watch", {"job_id": first, "watch_id": 9}),
                          ("jobs/cancel", {"job_id": first})):
        assert f"job {first} belongs to another identity" in refused(lambda: other.request(path, payload)), path
    assert [j for j in other.request("jobs/status", {})["jobs"] if j["id"] in jobs] == []
    assert job_state(conns["owner"], first) == "running", "the refused cancel must not have cancelled it"
    stranger = conns["stranger"]
    assert stranger_words(stranger) in refused(lambda: stranger.request("jobs/status", {"job_id": first}))


def test_the_per_owner_queue_is_bounded(conns, jobs):
    owner, other = conns["owner"], conns["other"]
    queued = [j for j in owner.request("jobs/status", {})["jobs"] if j["state"] == "queued"]
    for k in range(MAX_QUEUED_PER_OWNER - len(queued)):
        owner.request("genome/train", dict(JOB, output_alias=f"fill-{k}"))
    with pytest.raises(WireError) as e:
        owner.request("genome/train", dict(JOB, output_alias="one-too-many"))
    assert e.value.code == Code.BUSY and e.value.retry_after and f"{MAX_QUEUED_PER_OWNER} jobs queued" in e.value.message
    # The bound is per owner: another owner still gets in.
    theirs = other.request("genome/train", dict(JOB, output_alias="theirs"))["job_id"]
    assert job_state(other, theirs) == "queued"
    for job in owner.request("jobs/status", {})["jobs"]:
        if job["state"] == "queued" and job["id"] not in jobs:
            assert owner.request("jobs/cancel", {"job_id": job["id"]})["job"]["state"] == "cancelled"
    assert other.request("jobs/cancel", {"job_id": theirs})["job"]["state"] == "cancelled"


def test_an_admin_sees_and_cancels_any_job_and_the_next_one_starts(conns, jobs):
    first, second = jobs
    admin = conns["admin"]
    listed = {j["id"] for j in admin.request("jobs/status", {})["jobs"]}
    assert {first, second} <= listed
    assert admin.request("jobs/watch", {"job_id": first, "watch_id": 10})["job"]["id"] == first
    admin.request("jobs/cancel", {"job_id": first})
    wait_state(admin, first, "cancelled", timeout=30)
    wait_state(admin, second, "running", timeout=30)


def worker_pids(tower):
    return [pid for pid, cmd in descendants(tower.proc.pid).items() if "reticulum_grid.training.trainer" in cmd]


def test_a_trainer_worker_dies_with_its_tower(conns, jobs, tower):
    _, second = jobs
    wait_state(conns["owner"], second, "running")
    assert wait_until(lambda: worker_pids(tower), 10), "no trainer worker found under the tower"
    pid = worker_pids(tower)[0]
    assert os.getpgid(pid) == pid, "the worker leads its own process group"
    tower.kill()  # SIGKILL: the tower cannot stop its worker itself
    assert wait_until(lambda: not alive(pid), 10), f"trainer worker {pid} outlived its tower"


def test_a_worker_whose_tower_died_before_it_watched_ends_too():
    """A tower killed while its worker was still starting (importing torch
    under load) had already left the worker to another parent: seen in CI, the
    worker trained on. It knows its tower's pid from its environment instead."""
    import subprocess
    import sys

    from reticulum_grid.training.trainer import TOWER_PID_ENV
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that is nobody's parent now
    worker = subprocess.Popen([sys.executable, "-c", "import time\nfrom reticulum_grid.training.trainer import "
                               "die_with_parent\ndie_with_parent(0.05)\ntime.sleep(60)"],
                              env={**os.environ, TOWER_PID_ENV: str(gone.pid)})
    try:
        assert worker.wait(timeout=20) == -9, "the worker did not end itself"
    finally:
        worker.kill()
