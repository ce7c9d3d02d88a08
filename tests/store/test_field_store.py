"""Field cases of the store and the CLI's output: a disk that fills up during
a pull, leftovers a store collects, and --json lines from several threads."""

import errno
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from links import manifest as mf
from links.wire import Code, WireError
from reticulum_grid.store import collect as collecting, partial as partial_module
from reticulum_grid.store.blobstore import BlobStore
from reticulum_grid.store.sync import fetch_blob
from testbed.requirements import need

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20


class FileSource:
    """A chunk source reading a local copy of the blob (the protocol sync.py
    takes from any source: name, connect(), fetch())."""

    def __init__(self, path, name="local"):
        self.path, self.name = Path(path), name

    def connect(self):
        pass

    def fetch(self, blob_id, manifest, indices):
        with open(self.path, "rb") as f:
            for index in indices:
                f.seek(manifest.chunk_offset(index))
                yield index, f.read(manifest.chunks[index][1])


def blob_file(directory, mib):
    path = Path(directory) / "blob.bin"
    path.write_bytes(os.urandom(mib * MIB))
    return path, mf.build(path)


# -- case 6: disk full during a pull ------------------------------------------
def test_disk_full_is_insufficient_storage_and_keeps_verified_chunks(tmp_path, monkeypatch):
    """A test double for the disk: os.pwrite fails with ENOSPC after 3 chunks
    (test_real_disk_full below fills a real tmpfs)."""
    source_path, manifest = blob_file(tmp_path, 8)
    store = BlobStore(tmp_path / "store")
    real_pwrite, calls = os.pwrite, []

    def full_after_three_chunks(fd, data, offset):
        if len(data) > 1 and len([c for c in calls if c > 1]) >= 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        calls.append(len(data))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(partial_module.os, "pwrite", full_after_three_chunks)
    crashed = []
    monkeypatch.setattr("threading.excepthook", lambda args: crashed.append(args))
    sources = [FileSource(source_path, "a"), FileSource(source_path, "b")]
    with pytest.raises(WireError) as e:
        fetch_blob(store, manifest.blob_id, manifest.pack(), sources)
    assert e.value.code == Code.INSUFFICIENT_STORAGE and "disk full writing" in e.value.message, e.value
    assert not crashed, "no thread may die with a traceback"
    monkeypatch.setattr(partial_module.os, "pwrite", real_pwrite)
    info, report = fetch_blob(store, manifest.blob_id, manifest.pack(), sources)
    assert report.reused == len([c for c in calls if c > 1]) >= 3 and info.size == 8 * MIB


NAMESPACE_SCRIPT = textwrap.dedent("""
    import json, os, subprocess, sys, threading
    from pathlib import Path
    sys.path.insert(0, sys.argv[3])
    from links import manifest as mf
    from links.wire import WireError
    from reticulum_grid.store.blobstore import BlobStore
    from reticulum_grid.store.sync import fetch_blob
    from tests.store.test_field_store import FileSource

    mount, source = Path(sys.argv[1]), Path(sys.argv[2])
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300m", "tmpfs", str(mount)], check=True)
    crashed = []
    threading.excepthook = lambda args: crashed.append(repr(args.exc_value))
    manifest = mf.build(source)
    store = BlobStore(mount / "home" / "blobs")
    held = store.receive(manifest.blob_id, manifest.pack())  # the pull has begun: room was checked
    with open(mount / "filler", "wb") as f:  # then something else fills the disk up to 2.5 MiB
        free = os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize
        os.posix_fallocate(f.fileno(), 0, free - (5 << 19))
    out = {"crashed": crashed}
    try:
        fetch_blob(store, manifest.blob_id, manifest.pack(), [FileSource(source, "a"), FileSource(source, "b")])
        out["error"] = None
    except WireError as e:
        out["error"] = [e.code, e.message]
    out["have"] = sum(held.have)
    held.release()
    os.remove(mount / "filler")
    info, report = fetch_blob(store, manifest.blob_id, manifest.pack(), [FileSource(source)])
    out["reused"], out["size"] = report.reused, info.size
    print(json.dumps(out))
""")


def test_real_disk_full(tmp_path):
    """A real tmpfs that fills up, in a user and mount namespace of its own."""
    need("userns", "a tmpfs of its own to fill")
    source, _ = blob_file(tmp_path, 8)
    mount = tmp_path / "mnt"
    mount.mkdir()
    script = tmp_path / "disk_full.py"
    script.write_text(NAMESPACE_SCRIPT)
    result = subprocess.run(["unshare", "-Urm", sys.executable, str(script), str(mount), str(source), str(ROOT)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["error"] and out["error"][0] == Code.INSUFFICIENT_STORAGE and "disk full" in out["error"][1], out
    assert not out["crashed"] and "Traceback" not in result.stderr, result.stderr
    assert 1 <= out["have"] < 8 and out["reused"] == out["have"] and out["size"] == 8 * MIB, out


# -- case 9: leftovers ----------------------------------------------------------
def test_collect_keeps_what_is_referred_to(tmp_path):
    store = BlobStore(tmp_path / "store")
    files = {}
    for name in ("named", "orphan", "young", "job", "external", "abandoned"):
        files[name] = tmp_path / f"{name}.txt"
        files[name].write_bytes(os.urandom(2000))
    named = store.add_file(files["named"], alias="named", copy=True)
    orphan = store.add_file(files["orphan"], copy=True)
    young = store.add_file(files["young"], copy=True)
    job = store.add_file(files["job"], kind="dataset", copy=True)
    external = store.add_file(files["external"])
    abandoned = mf.build(files["abandoned"])
    store.receive(abandoned.blob_id, abandoned.pack()).release()
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3000))
    receiving = mf.build(big)
    active = store.receive(receiving.blob_id, receiving.pack())
    now = time.time() + 100
    os.utime(store.root / "objects" / young.hex, (now, now))
    for path in (store.root / "objects" / young.hex).iterdir():
        os.utime(path, (now, now))
    removed = collecting.collect(store, max_age_s=50, in_use={str(job.path)}, now=now)
    assert set(removed) == {orphan.hex, external.hex, abandoned.blob_id.hex()}
    assert store.info(named.blob_id) and store.info(young.blob_id) and store.info(job.blob_id)
    assert files["external"].exists(), "a file registered in place is only forgotten"
    assert store.info(external.blob_id) is None and active.dir.exists()
    active.release()


# -- case 7: one JSON document per line ------------------------------------------
THREADS_SCRIPT = textwrap.dedent("""
    import sys, threading
    sys.setswitchinterval(1e-6)
    from reticulum_grid.cli.common import ProgressBar
    bar = ProgressBar(True, "pull")
    def work(n):
        for i in range(400):
            bar(i * n, 10 ** 9)
    threads = [threading.Thread(target=work, args=(n,)) for n in range(1, 9)]
    for t in threads: t.start()
    for t in threads: t.join()
""")


def test_json_lines_stay_whole_from_several_threads():
    result = subprocess.run([sys.executable, "-c", THREADS_SCRIPT], capture_output=True, text=True, timeout=60,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 8 * 400
    for line in lines:
        assert "progress" in json.loads(line)
