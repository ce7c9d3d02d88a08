"""BlobStore: aliases, content addressing, resumable verified receiving (unit tests, local files)."""

import os
import shutil

import blake3
import pytest

from links import manifest as mf
from links.wire import WireError
from reticulum_grid.store.blobstore import BlobStore
from reticulum_grid.store.names import check_alias

CHUNK = mf.CHUNK_SIZE


@pytest.fixture
def blob_file(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(os.urandom(3 * CHUNK + 777))
    return path


def test_add_in_place_and_copy(tmp_path, blob_file):
    store = BlobStore(tmp_path / "store")
    info = store.add_file(blob_file, alias="big", kind="dataset")
    assert info.external and info.path == blob_file and info.size == blob_file.stat().st_size
    assert info.blob_id == mf.build(blob_file).blob_id
    assert store.resolve("big") == info.blob_id == store.resolve(info.hex[:10])
    copied = BlobStore(tmp_path / "store2").add_file(blob_file, alias="big", copy=True)
    assert not copied.external and copied.path.read_bytes() == blob_file.read_bytes()
    assert copied.path.stat().st_mode & 0o222 == 0, "stored blobs are read-only"


def test_read_chunk_checks_external_files(tmp_path, blob_file):
    store = BlobStore(tmp_path / "store")
    info = store.add_file(blob_file, alias="big")
    assert store.read_chunk(info.blob_id, 3) == blob_file.read_bytes()[3 * CHUNK:]
    with pytest.raises(WireError, match="out of range"):
        store.read_chunk(info.blob_id, 4)
    data = bytearray(blob_file.read_bytes())
    data[10] ^= 0xFF
    blob_file.write_bytes(bytes(data))
    with pytest.raises(WireError) as e:
        store.read_chunk(info.blob_id, 0)
    assert e.value.code == "corrupt"


@pytest.mark.parametrize("alias", ["../x", "a/b", "a\\b", "..", ".hidden", "", "x" * 65, "a..b", "sp ace"])
def test_bad_aliases(alias):
    with pytest.raises(WireError, match="alias"):
        check_alias(alias)


def test_receive_resume_and_publish(tmp_path, blob_file):
    source = BlobStore(tmp_path / "src")
    info = source.add_file(blob_file, alias="big")
    manifest = source.manifest_bytes(info.blob_id)
    dest = BlobStore(tmp_path / "dst")
    partial = dest.receive(info.blob_id, manifest)
    partial.write(0, source.read_chunk(info.blob_id, 0))
    partial.write(2, source.read_chunk(info.blob_id, 2))
    partial.release()
    assert not dest.has(info.blob_id) and not (dest.root / "objects" / info.hex / "data").exists()

    resumed = BlobStore(tmp_path / "dst").receive(info.blob_id, manifest)
    assert resumed.missing() == [1, 3], "verified chunks survive in the have-map"
    with pytest.raises(WireError) as e:
        resumed.write(1, b"x" * CHUNK)
    assert e.value.code == "bad_chunk"
    for i in resumed.missing():
        resumed.write(i, source.read_chunk(info.blob_id, i))
    published = resumed.finish(alias="copy", kind="dataset")
    assert blake3.blake3(published.path.read_bytes()).digest() == blake3.blake3(blob_file.read_bytes()).digest()
    assert published.aliases == ["copy"] and not (dest.root / "partial" / info.hex).exists()
    assert dest.receive(info.blob_id, manifest).missing() == [], "a complete blob needs nothing"


def test_final_check_catches_bad_data_on_disk(tmp_path, blob_file):
    source = BlobStore(tmp_path / "src")
    info = source.add_file(blob_file)
    dest = BlobStore(tmp_path / "dst")
    partial = dest.receive(info.blob_id, source.manifest_bytes(info.blob_id))
    for i in partial.missing():
        partial.write(i, source.read_chunk(info.blob_id, i))
    with open(partial.dir / "data", "r+b") as f:  # bit rot after the write
        f.seek(CHUNK + 5)
        f.write(b"\x00\x01")
    with pytest.raises(WireError) as e:
        partial.finish()
    assert e.value.code == "bad_chunk" and partial.missing() == [1] and not dest.has(info.blob_id)


def test_manifest_must_hash_to_id(tmp_path, blob_file):
    info = BlobStore(tmp_path / "src").add_file(blob_file)
    other = mf.build(blob_file, chunk_size=CHUNK // 2).pack()
    with pytest.raises(WireError) as e:
        BlobStore(tmp_path / "dst").receive(info.blob_id, other)
    assert e.value.code == "bad_manifest"
    with pytest.raises(WireError) as e:
        BlobStore(tmp_path / "dst").receive(info.blob_id, b"\xc1garbage")
    assert e.value.code == "bad_manifest"


def test_refuses_blob_that_does_not_fit(tmp_path, blob_file, monkeypatch):
    info = BlobStore(tmp_path / "src").add_file(blob_file)
    manifest = BlobStore(tmp_path / "src").manifest_bytes(info.blob_id)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=1024))
    with pytest.raises(WireError) as e:
        BlobStore(tmp_path / "dst").receive(info.blob_id, manifest)
    assert e.value.code == "insufficient_storage" and "MiB free" in e.value.message


def test_unknown_names(tmp_path):
    store = BlobStore(tmp_path / "s")
    for name in ("nope", "deadbeef", "zz" * 40):
        with pytest.raises(WireError) as e:
            store.resolve(name)
        assert e.value.code == "unknown_blob"


def test_models_and_adapters_must_be_gguf(tmp_path, blob_file, model_path):
    from reticulum_grid.store.gguf_info import file_kind
    store = BlobStore(tmp_path / "store")
    with pytest.raises(WireError, match="GGUF") as e:
        store.add_file(blob_file, alias="notes", kind="model")
    assert e.value.code == "bad_request" and store.list() == []
    assert file_kind(blob_file) == "file" and file_kind(model_path) == "model"
    # A peer that pushes a text file as a "model": verified, then refused, and nothing kept.
    source = BlobStore(tmp_path / "src")
    info = source.add_file(blob_file, alias="notes")
    partial = store.receive(info.blob_id, source.manifest_bytes(info.blob_id))
    for index in range(4):
        partial.write(index, source.read_chunk(info.blob_id, index))
    with pytest.raises(WireError, match="GGUF"):
        partial.finish(alias="notes", kind="model")
    partial.release()
    assert not store.has(info.blob_id) and not partial.dir.exists() and store.list() == []


def test_remove_an_alias_then_the_blob(tmp_path, blob_file):
    store = BlobStore(tmp_path / "store")
    info = store.add_file(blob_file, alias="one", kind="dataset", copy=True)
    store.set_alias("two", info.blob_id)
    assert store.remove("one") == [] and store.has(info.blob_id)
    assert store.remove("two") == [info.blob_id] and not store.has(info.blob_id)
    with pytest.raises(WireError):
        store.resolve("two")
    kept = store.add_file(blob_file, alias="in-place", kind="dataset")
    assert store.remove(kept.hex) == [kept.blob_id] and blob_file.exists(), "files in place are only forgotten"
    assert store.list() == []


def test_a_shared_partial_survives_a_refused_finish(tmp_path, blob_file):
    source = BlobStore(tmp_path / "src")
    info = source.add_file(blob_file, alias="notes")
    manifest = source.manifest_bytes(info.blob_id)
    store = BlobStore(tmp_path / "dst")
    first, second = store.receive(info.blob_id, manifest), store.receive(info.blob_id, manifest)
    assert first is second
    for index in range(4):
        first.write(index, source.read_chunk(info.blob_id, index))
    with pytest.raises(WireError, match="GGUF"):
        first.finish(kind="model")  # a peer lied about the kind
    with pytest.raises(WireError) as e:
        second.finish(kind="file")
    assert e.value.code == "incomplete"
    first.release()
    second.release()
    again = store.receive(info.blob_id, manifest)  # a fresh transfer starts over and succeeds
    for index in range(4):
        again.write(index, source.read_chunk(info.blob_id, index))
    assert again.finish(alias="notes", kind="file").kind == "file"
    again.release()


def test_a_busy_source_is_asked_again(tmp_path, blob_file, monkeypatch):
    from reticulum_grid.store import sync
    monkeypatch.setattr(sync, "BUSY_PAUSE_S", 0.01)
    source = BlobStore(tmp_path / "src")
    info = source.add_file(blob_file, alias="big")

    class BusyOnceSourceDouble:
        """Test double for a sync source whose link first answers "busy"."""

        name = "busy-once"

        def __init__(self):
            self.busy = 2

        def connect(self):
            pass

        def fetch(self, blob_id, manifest, indices):
            if self.busy:
                self.busy -= 1
                raise WireError("busy", "4 chunk requests already running on this link")
            for index in indices:
                yield index, source.read_chunk(blob_id, index)

    store = BlobStore(tmp_path / "dst")
    got, report = sync.fetch_blob(store, info.blob_id, source.manifest_bytes(info.blob_id), [BusyOnceSourceDouble()])
    assert store.has(info.blob_id) and report.fetched == {"busy-once": 4} and not report.failed_sources
