"""Blob commands with bad input: clear coded errors, nothing written outside
the store, no partial blob ever visible as complete, the tower keeps serving."""

import os

import pytest

from links import manifest as mf
from links.wire import Code, WireError

SMALL_BYTES = 3 * 2**20 + 99
HOLDER = "sync-bad"  # the tower of tests/store/conftest.py that holds it


def code_of(call):
    with pytest.raises(WireError) as e:
        call()
    return e.value


def push_request(small, **fields):
    m = mf.build(small)
    return {"blob_id": m.blob_id, "manifest": m.pack(), "kind": "dataset", "xfer_id": 1, **fields}


@pytest.mark.parametrize("name, payload, code, words", [
    ("unknown blob", {"name": "no-such-blob"}, Code.UNKNOWN_BLOB, "no-such-blob"),
    ("unknown id", {"name": "ab" * 32}, Code.UNKNOWN_BLOB, ""),
    ("wrong type", {"name": 5}, Code.BAD_REQUEST, "must be str"),
    ("missing", {}, Code.BAD_REQUEST, "missing field"),
])
def test_manifest_errors(conn, name, payload, code, words):
    error = code_of(lambda: conn.request("blobs/manifest", payload))
    assert error.code == code and words in error.message


@pytest.mark.parametrize("fields, code, words", [
    ({"blob_id": "zz"}, Code.BAD_REQUEST, "32 bytes"),
    ({"blob_id": b"\x00" * 31}, Code.BAD_REQUEST, "32 bytes"),
    ({"blob_id": b"\x01" * 32}, Code.BAD_MANIFEST, "does not hash to its blob id"),
    ({"manifest": b"\xc1\xc1"}, Code.BAD_MANIFEST, ""),
    ({"alias": "../../evil"}, Code.BAD_REQUEST, "alias"),
    ({"alias": "a/b"}, Code.BAD_REQUEST, "alias"),
    ({"kind": "weights"}, Code.BAD_REQUEST, "kind"),
    ({"xfer_id": -3}, Code.BAD_REQUEST, "xfer_id"),
])
def test_push_errors(conn, small, fields, code, words):
    error = code_of(lambda: conn.request("blobs/push", push_request(small, **fields)))
    assert error.code == code and words in error.message, error


def test_pull_errors(conn):
    error = code_of(lambda: conn.request("blobs/pull", {"name": "x", "sources": ["nope"], "xfer_id": 1}))
    assert error.code == Code.BAD_REQUEST and "destination hashes" in error.message


def test_chunk_index_out_of_range_and_unknown_blob(conn, small):
    m = mf.build(small)
    padded = mf.Manifest(m.chunk_size, m.total_size, m.chunks * 3)  # claims chunks the blob lacks
    error = code_of(lambda: list(conn.fetch(m.blob_id, padded, [9])))
    assert error.code == Code.BAD_REQUEST and "out of range" in error.message
    other = mf.build(__file__)
    error = code_of(lambda: list(conn.fetch(other.blob_id, other, [0])))
    assert error.code == Code.UNKNOWN_BLOB


def test_oversized_chunk_from_a_pusher_is_refused(hub, tower, conn, tmp_path):
    fresh = tmp_path / "fresh.bin"
    fresh.write_bytes(os.urandom(SMALL_BYTES))
    local = hub.grid.store.add_file(fresh, alias="fresh", kind="dataset")
    # The pusher serves every chunk with extra bytes: more than the manifest allows.
    conn.offer(local.blob_id, lambda blob_id, index: hub.grid.store.read_chunk(blob_id, index) + b"!!")
    events = conn.watch_transfer(77)
    conn.request("blobs/push", {"blob_id": local.blob_id, "manifest": hub.grid.store.manifest_bytes(local.blob_id),
                                "alias": "oversized", "kind": "dataset", "xfer_id": 77})
    end = None
    while end is None or type(end).__name__ != "TransferEnd":
        end = events.get(timeout=30)
    assert not end.ok and end.code == Code.INCOMPLETE and "bad_chunk" in end.message
    objects = tower.dir / "blobs" / "objects" / local.hex
    assert not (objects / "data").exists(), "a blob that did not verify must not look complete"
    conn.offer(local.blob_id, hub.grid.store.read_chunk)  # an honest pusher afterwards


def test_nothing_written_outside_the_store(tower):
    # rpc-cache: the RPC server's tensor cache, which only the tower fills (split/tensorcache.py).
    assert sorted(p.name for p in tower.dir.iterdir()) == ["blobs", "identity", "jobs", "lxmf", "rns", "rpc-cache",
                                                           "sync-bad.log", "tower.toml"]
    assert sorted(p.name for p in (tower.dir / "blobs").iterdir()) == ["index.json", "objects", "partial"]


def test_tower_still_serves(hub, tower, conn, small):
    m = mf.build(small)
    assert b"".join(d for _, d in conn.fetch(m.blob_id, m, [0, 1, 2, 3])) == small.read_bytes()


def test_blob_larger_than_the_free_disk_is_refused(conn, tower):
    import shutil
    free = shutil.disk_usage(tower.dir).free
    chunk = mf.MAX_CHUNK_SIZE
    count = free // chunk + 8
    fake = mf.Manifest(chunk, count * chunk, tuple((bytes([i % 256]) * 32, chunk) for i in range(count)))
    error = code_of(lambda: conn.request("blobs/push", {"blob_id": fake.blob_id, "manifest": fake.pack(),
                                                        "kind": "dataset", "xfer_id": 5}))
    assert error.code == Code.INSUFFICIENT_STORAGE and "MiB free" in error.message
    assert not (tower.dir / "blobs" / "partial" / fake.blob_id.hex()).exists()


def test_remote_push_cannot_take_or_rekind_a_model(hub, conn, tower, tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(os.urandom(7000))
    m = mf.build(junk)
    error = code_of(lambda: conn.request("blobs/push", {"blob_id": m.blob_id, "manifest": m.pack(),
                                                        "alias": "small", "kind": "model", "xfer_id": 11}))
    assert error.code == Code.BAD_REQUEST and "names a dataset" in error.message


def test_aliases_that_would_break_caps_or_shadow_ids_are_refused(conn, small):
    m = mf.build(small)
    for alias in ("x" * 33, "model\n", m.blob_id.hex(), "deadbeef"):
        error = code_of(lambda: conn.request("blobs/push", {"blob_id": m.blob_id, "manifest": m.pack(),
                                                            "alias": alias, "kind": "dataset", "xfer_id": 12}))
        assert error.code == Code.BAD_REQUEST and "alias" in error.message, alias


def test_long_names_are_refused_and_the_link_keeps_working(hub, conn):
    error = code_of(lambda: conn.request("blobs/pull", {"name": "n" * 30000, "sources": [b"\x01" * 16],
                                                        "xfer_id": 13}))
    assert error.code == Code.BAD_REQUEST
    from links.stream import StreamError
    assert len(StreamError(1, "x", "y" * 30000).message) <= 1024, "free text is cut before it is sent"
    assert b"".join(d for _, d in conn.fetch(*_small_fetch(conn)))


def _small_fetch(conn):
    reply = conn.request("blobs/manifest", {"name": "small"})
    m = mf.unpack(reply["manifest"], expected_id=reply["blob_id"])
    return reply["blob_id"], m, [0]


def test_concurrent_pushes_of_one_blob_all_succeed(hub, tower, conn, tmp_path):
    import threading

    from reticulum_grid.client.transfers import _await_transfer
    blob = tmp_path / "shared.bin"
    blob.write_bytes(os.urandom(6 * 2**20))
    info = hub.grid.store.add_file(blob, alias="shared", kind="dataset")
    conn.offer(info.blob_id, hub.grid.store.read_chunk)
    manifest = hub.grid.store.manifest_bytes(info.blob_id)
    results = []

    def push(xfer_id):
        events = conn.watch_transfer(xfer_id)
        try:
            conn.request("blobs/push", {"blob_id": info.blob_id, "manifest": manifest, "kind": "dataset",
                                        "xfer_id": xfer_id})
            results.append(_await_transfer(conn, events, None))
        except WireError as e:
            results.append(e)

    threads = [threading.Thread(target=push, args=(100 + k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 3 and not [r for r in results if isinstance(r, WireError)], results
    stored = tower.dir / "blobs" / "objects" / info.hex / "data"
    assert stored.read_bytes() == blob.read_bytes()
