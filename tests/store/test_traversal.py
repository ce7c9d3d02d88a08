"""Names from the wire or the command line never leave the blob store.

Every name a client controls (an alias, a blob id, a name to pull, a
manifest's name) is tried with ``../`` parts ending in a unique marker, on a
real tower and in the client's own store. Afterwards the whole tree this
test session created (every tower, client and temp dir), the working
directory and /tmp are searched for the marker, and the tower's store holds
only what its layout allows."""

import os
import re
import secrets
from pathlib import Path

import pytest

from links import manifest as mf
from links.wire import Code, WireError
from reticulum_grid.store.blobstore import BlobStore
from tests.conftest import rngrid

MARKER = f"rngrid-escape-{secrets.token_hex(4)}"
EVIL = (f"../../{MARKER}", f"../{MARKER}", f"/tmp/{MARKER}", f"..\\..\\{MARKER}", f"a/../../{MARKER}")
#: Test ids that hold no marker: every pytest-xdist worker must collect the same names.
EVIL_IDS = ("up-two", "up-one", "absolute", "backslashes", "inner-up")
HEX64 = re.compile(r"[0-9a-f]{64}")
SMALL_BYTES = 200_000
HOLDER = "trav-a"  # the tower of tests/store/conftest.py that holds it


def refused(call):
    with pytest.raises(WireError) as e:
        call()
    assert e.value.code in (Code.BAD_REQUEST, Code.UNKNOWN_BLOB), e.value
    return e.value


@pytest.mark.parametrize("evil", EVIL, ids=EVIL_IDS)
def test_names_with_path_parts_are_refused_by_the_tower(conn, small, evil):
    m = mf.build(small)
    push = {"blob_id": m.blob_id, "manifest": m.pack(), "kind": "dataset", "xfer_id": 21}
    refused(lambda: conn.request("blobs/push", {**push, "alias": evil}))
    refused(lambda: conn.request("blobs/push", {**push, "blob_id": evil}))
    refused(lambda: conn.request("blobs/manifest", {"name": evil}))
    refused(lambda: conn.request("blobs/pull", {"name": "small", "sources": [b"\x01" * 16], "alias": evil,
                                                "kind": "dataset", "xfer_id": 22}))


@pytest.mark.parametrize("evil", EVIL, ids=EVIL_IDS)
def test_names_with_path_parts_are_refused_by_the_client_store(hub, tower, small, tmp_path, evil):
    store = BlobStore(tmp_path / "store")
    with pytest.raises(WireError) as added:
        store.add_file(small, alias=evil, kind="dataset", copy=True)
    assert added.value.code == Code.BAD_REQUEST and f"alias {evil!r} must be" in added.value.message, added.value
    with pytest.raises(WireError) as resolved:
        store.resolve(evil)
    assert resolved.value.code == Code.UNKNOWN_BLOB, resolved.value
    with pytest.raises(WireError) as pulled:
        hub.grid.pull("small", from_tower=tower.name, alias=evil)
    assert pulled.value.code == Code.BAD_REQUEST and f"alias {evil!r} must be" in pulled.value.message, pulled.value
    added = rngrid("models", "add", str(small), "--alias", evil, home=tmp_path / "cli")
    assert added.returncode != 0 and "alias" in added.stderr, added.stderr


def test_a_pull_by_a_traversing_name_writes_nothing(hub, conn, tower):
    # The tower passes the name on to a source tower: nothing may be created for it on either.
    source = hub.start_tower("trav-b", models={}, allow={hub.tower_identity(tower.name): ["sync"]},
                             connect=[hub.address, tower.address])
    try:
        dest = hub.wait_tower(source.name).destination_hash
        events = conn.watch_transfer(23)
        conn.request("blobs/pull", {"name": f"../../{MARKER}", "sources": [dest], "kind": "dataset", "xfer_id": 23})
        end = None
        while end is None or type(end).__name__ != "TransferEnd":
            end = events.get(timeout=60)
        assert not end.ok and end.code == Code.UNKNOWN_BLOB, end.message
    finally:
        source.stop()


def marked(root):
    """Paths under ``root`` whose name holds the marker (the walk never follows links out)."""
    found = []
    for folder, dirs, files in os.walk(root, onerror=lambda e: None):
        found += [os.path.join(folder, n) for n in dirs + files if MARKER in n]
    return found


def test_nothing_named_by_the_wire_exists_anywhere(hub, tower):
    session_tree = hub.root.parent  # every directory this pytest run created
    assert not marked(session_tree), marked(session_tree)
    assert not [p for p in os.listdir(Path.cwd()) if MARKER in p]
    assert not [p for p in os.listdir("/tmp") if MARKER in p]


def test_the_towers_store_holds_only_its_layout(tower):
    blobs = tower.dir / "blobs"
    for path in blobs.rglob("*"):
        parts = path.relative_to(blobs).parts
        if parts[0] == "index.json" and len(parts) == 1:
            continue
        assert parts[0] in ("objects", "partial"), path
        assert len(parts) == 1 or HEX64.fullmatch(parts[1]), path
        assert len(parts) <= 3, path
    assert {p.name for p in tower.dir.iterdir()} == {"blobs", "identity", "jobs", "lxmf", "rns", "rpc-cache",
                                                     f"{tower.name}.log", "tower.toml"}
