"""Blob sync between real towers over real RNS: 64 MiB blobs, resume, lying
sources, several sources, push, and syncing a model before running it."""

import os
import time

import blake3
import pytest

from links.chunks import TransferEnd
from links.wire import Code, WireError
from reticulum_grid.client import Usage
from reticulum_grid.inference.default_model import DEFAULT_ALIAS, default_model_path
from reticulum_grid.store.sync import SyncReport
from tests.store.blob_towers import holding, random_file

SIZE = 64 * 2**20 + 4321


def digest(path):
    return blake3.blake3(open(path, "rb").read()).digest()


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    return random_file(tmp_path_factory, "big.bin", SIZE)


@pytest.fixture(scope="module")
def sources(hub, big):
    with holding(hub, big, "big", "src-a", "src-b") as towers:
        yield towers


def test_pull_64mb_blob_and_compare_blake3(hub, sources, big):
    info, report = hub.grid.pull("big", from_tower="src-a")
    assert digest(info.path) == digest(big) and info.size == SIZE and info.aliases == ["big"]
    assert report.fetched == {"src-a": 65} and report.reused == 0 and report.chunks == 65
    print(f"pulled {SIZE >> 20} MiB in {report.seconds:.2f} s")


def test_resync_of_identical_blob_transfers_nothing(hub, sources):
    info, report = hub.grid.pull("big", from_tower="src-b")
    assert report.fetched == {} and report.reused == 65


def test_two_sources_serve_disjoint_chunks(hub, sources, big, tmp_path):
    grid = hub.grid
    fresh = type(grid.store)(tmp_path / "store")  # an empty store: every chunk must be fetched
    grid.store, saved = fresh, grid.store
    try:
        info, report = grid.pull("big")
    finally:
        grid.store = saved
    assert set(report.fetched) == {"src-a", "src-b"}, report.fetched
    assert sum(report.fetched.values()) == 65, "each chunk came from exactly one source"
    assert min(report.fetched.values()) > 0 and digest(info.path) == digest(big)


def test_lying_source_is_detected_and_the_blob_still_completes(hub, sources, big, tmp_path):
    liar = hub.start_tower("liar", models={}, roles=("infer", "sync"), blobs=[(big, "big", "dataset", True)])
    hub.wait_tower(liar.name)
    data_path = next((liar.dir / "blobs" / "objects").glob("*/data"))
    os.chmod(data_path, 0o644)
    with open(data_path, "r+b") as f:  # bit rot in every chunk of the liar's copy
        for i in range(65):
            f.seek(i * 2**20 + 100)
            f.write(b"\xde\xad")
    grid = hub.grid
    grid.store, saved = type(grid.store)(tmp_path / "store"), grid.store
    try:
        entries = [hub.wait_tower("liar"), hub.wait_tower("src-a")]
        from reticulum_grid.store.sync import LinkSource, fetch_blob
        reply = grid.connection(entries[0]).request("blobs/manifest", {"name": "big"})
        info, report = fetch_blob(grid.store, reply["blob_id"], reply["manifest"],
                                  [LinkSource(grid.connection(e)) for e in entries])
    finally:
        grid.store = saved
    assert report.lying_sources == ["liar"] and "bad_chunk" in report.failed_sources["liar"]
    assert report.fetched.get("src-a", 0) + report.fetched.get("liar", 0) == 65
    assert digest(info.path) == digest(big)


def test_resume_after_the_sender_dies_refetches_no_verified_chunk(hub, tmp_path, monkeypatch):
    other = tmp_path / "other.bin"
    other.write_bytes(os.urandom(SIZE))
    sender = hub.start_tower("dying", models={}, roles=("infer", "sync"), blobs=[(other, "other", "dataset", False)])
    hub.wait_tower(sender.name)

    def kill_half_way(done, total):
        if done > total // 2 and sender.proc.poll() is None:
            sender.kill()

    with pytest.raises(WireError) as e:
        hub.grid.pull("other", from_tower="dying", progress=kill_half_way)
    assert e.value.code == Code.INCOMPLETE
    partial_dir = next((hub.grid.store.root / "partial").iterdir())
    verified = {i for i, v in enumerate((partial_dir / "have").read_bytes()) if v}
    assert 32 <= len(verified) < 65

    written = []
    from reticulum_grid.store import blobstore
    original = blobstore.Partial.write
    monkeypatch.setattr(blobstore.Partial, "write", lambda self, i, d: (written.append(i), original(self, i, d))[1])
    old = hub.wait_tower("dying").destination_hash
    hub.grid.table.remove(old)
    sender.start()
    hub.wait_tower("dying")
    info, report = hub.grid.pull("other", from_tower="dying")
    assert not verified & set(written), "a verified chunk was fetched again"
    assert report.reused == len(verified) and report.fetched == {"dying": 65 - len(verified)}
    assert digest(info.path) == digest(other)


def test_push_and_repush(hub, big):
    target = hub.start_tower("push-target", models={}, roles=("infer", "sync"))
    hub.wait_tower(target.name)
    seen = []
    report = hub.grid.push("big", "push-target", progress=lambda d, t: seen.append((d, t)))
    assert report["fetched"] and sum(report["fetched"].values()) == 65 and seen[-1] == (SIZE, SIZE)
    stored = next((target.dir / "blobs" / "objects").glob("*/data"))
    assert digest(stored) == digest(big)
    assert hub.grid.push("big", "push-target")["reused"] == 65, "a second push moves nothing"


def test_push_needs_the_sync_role(hub, big):
    target = hub.start_tower("no-sync", models={}, roles=("infer",))
    hub.wait_tower(target.name)
    with pytest.raises(WireError) as e:
        hub.grid.push("big", "no-sync")
    assert e.value.code == Code.NOT_ALLOWED and "sync" in e.value.message


def test_model_pushed_from_the_client_before_dispatch(hub):
    hub.grid.store.add_file(default_model_path(), alias="smol-local", kind="model")
    target = hub.start_tower("empty-x", models={}, roles=("infer", "sync"))
    entry = hub.wait_tower(target.name)
    assert entry.caps.model("smol-local") is None
    seen = []
    stream = hub.grid.execute("ai/inference", {"model": "smol-local", "prompt": "Hello", "max_tokens": 5},
                              tower="empty-x", progress=lambda d, t: seen.append(d))
    pieces = list(stream)
    assert isinstance(pieces[-1], Usage) and pieces[-1].completion_tokens > 0 and seen
    blobs = hub.grid.connection(entry).request("caps/full", {})["blobs"]
    assert [b["loaded"] for b in blobs if b["alias"] == "smol-local"] == [True]


def test_model_synced_tower_to_tower_before_dispatch(hub):
    empty_id = hub.tower_identity("empty-y")
    holder = hub.start_tower("model-holder", allow={hub.grid.identity_hash: ["infer"], empty_id: ["sync"]})
    # Towers reach each other directly (the hub is no transport node).
    target = hub.start_tower("empty-y", models={}, roles=("infer", "sync"), connect=[hub.address, holder.address])
    hub.wait_tower(holder.name)
    hub.wait_tower(target.name)
    stream = hub.grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "prompt": "Hello", "max_tokens": 5},
                              tower="empty-y")
    assert list(stream)[-1].completion_tokens > 0
    assert next((target.dir / "blobs" / "objects").glob("*/data")).stat().st_size > 90 * 2**20


def test_cli_models_pull_and_push(hub, sources, big, tmp_path):
    import json

    from reticulum_grid.node.allowlist import allow
    from tests.conftest import rngrid
    home = tmp_path / "laptop"
    laptop_id = rngrid("id", home=home).stdout.strip()
    allow(sources[0].config_path, laptop_id, ["sync"])
    pulled = rngrid("pull", "big", "--json", "--connect", sources[0].address, home=home)
    assert pulled.returncode == 0, pulled.stderr
    lines = [json.loads(line) for line in pulled.stdout.splitlines()]
    assert "progress" in lines[0] and lines[-1]["report"]["fetched"] == {"src-a": 65}
    listed = json.loads(rngrid("models", "--json", "--wait", "0", home=home).stdout)
    assert [(r["aliases"], r["size"], r["kind"]) for r in listed] == [(["big"], SIZE, "dataset")]

    note = tmp_path / "note.txt"
    note.write_text("a small dataset\n" * 100)
    added = rngrid("models", "add", str(note), "--alias", "notes", "--kind", "dataset", home=home)
    assert added.returncode == 0 and added.stdout.startswith("notes -> "), added.stderr
    refused = rngrid("push", "notes", "--to", "src-b", "--connect", sources[1].address, home=home)
    assert refused.returncode == 1 and "not_allowed" in refused.stderr
    allow(sources[1].config_path, laptop_id, ["sync"])
    pushed = rngrid("push", "notes", "--to", "src-b", "--connect", sources[1].address, home=home)
    assert pushed.returncode == 0 and "notes is on src-b" in pushed.stderr, pushed.stderr

    as_model = rngrid("models", "add", str(note), "--alias", "mistake", "--kind", "model", home=home)
    assert as_model.returncode == 1 and "must be a GGUF file" in as_model.stderr
    other = tmp_path / "other.txt"
    other.write_text("not a model\n")
    guessed = rngrid("models", "add", str(other), "--alias", "text", home=home)
    assert guessed.returncode == 0 and guessed.stdout.rstrip().endswith("file)"), guessed.stdout
    assert rngrid("models", "rm", "text", home=home).returncode == 0
    removed = rngrid("models", "rm", "notes", home=home)
    assert removed.returncode == 0 and "deleted blob" in removed.stdout, removed.stdout
    listed = json.loads(rngrid("models", "--json", "--wait", "0", home=home).stdout)
    assert [r["aliases"] for r in listed] == [["big"]] and note.exists()


def transfer_end(events, timeout=30.0):
    """The TransferEnd among a watched transfer's messages (queue.Empty after ``timeout`` seconds without one)."""
    deadline = time.monotonic() + timeout
    while True:
        message = events.get(timeout=max(0.1, deadline - time.monotonic()))
        if isinstance(message, TransferEnd):
            return message


def test_a_remote_push_cannot_replace_or_hide_a_configured_model(hub, sources):
    from links import manifest as mf
    tower = hub.start_tower("guarded", roles=("infer", "sync"))
    conn = hub.grid.connection(hub.wait_tower(tower.name))
    m = mf.build(default_model_path())
    with pytest.raises(WireError) as e:  # taking the configured alias
        conn.request("blobs/push", {"blob_id": m.blob_id, "manifest": m.pack(), "alias": DEFAULT_ALIAS,
                                    "kind": "model", "xfer_id": 1})
    assert e.value.code == Code.NOT_ALLOWED
    # Re-offering the model's own manifest as a dataset must not re-kind it: once the tower ends that
    # transfer (its TransferEnd), the blob is still the model.
    events = conn.watch_transfer(2)
    conn.request("blobs/push", {"blob_id": m.blob_id, "manifest": m.pack(), "kind": "dataset", "xfer_id": 2})
    ended = transfer_end(events)
    print(f"the re-offered model's transfer ended: {ended}")
    blobs = conn.request("caps/full", {})["blobs"]
    assert [(b["alias"], b["kind"]) for b in blobs] == [(DEFAULT_ALIAS, "model")]
    assert list(hub.grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "prompt": "Hi", "max_tokens": 3},
                                 tower=tower.name))[-1].completion_tokens > 0


class StoreEmptiedDuringPull:
    """A grid double whose pull completes, after which its store no longer has
    the blob (another process ran ``rngrid models rm`` in between): the store
    answers None for it."""

    def pull(self, name, **_):
        return None, SyncReport(bytes(32), SIZE, 1)


def test_cli_pull_of_a_blob_removed_meanwhile_ends_with_an_error(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from reticulum_grid.cli import main, store
    monkeypatch.setattr(store, "open_grid", lambda *_: StoreEmptiedDuringPull())
    result = CliRunner().invoke(main, ["--home", str(tmp_path), "pull", "big"])
    assert result.exit_code == 1 and "big was fetched but is no longer in the local store" in result.output, result


class TransferRecorder:
    """A grid double that notes what each pull and push was given and transfers nothing."""

    def __init__(self):
        self.calls = []

    def pull(self, name, alias=None, max_seconds=None, **_):
        self.calls.append(("pull", name, alias, max_seconds))
        return None, SyncReport(bytes(32), SIZE, 1)

    def push(self, name, to_tower, alias=None, max_seconds=None, **_):
        self.calls.append(("push", name, alias, max_seconds))
        return {}


def test_cli_pull_and_push_refuse_a_slow_transfer_unless_forced(monkeypatch, tmp_path):
    """--force lifts the time limit a radio-class link puts on pull and push; --alias reaches the grid."""
    from click.testing import CliRunner

    from reticulum_grid.cli import main, store
    from reticulum_grid.store.sync import MAX_TRANSFER_S
    grid = TransferRecorder()
    monkeypatch.setattr(store, "open_grid", lambda *_: grid)
    for args in (["pull", "big"], ["pull", "big", "--force", "--alias", "b"], ["push", "big", "--to", "t", "--json"],
                 ["push", "big", "--to", "t", "--force", "--alias", "b"]):
        CliRunner().invoke(main, ["--home", str(tmp_path), *args])
    assert grid.calls == [("pull", "big", None, MAX_TRANSFER_S), ("pull", "big", "b", None),
                          ("push", "big", None, MAX_TRANSFER_S), ("push", "big", "b", None)]
