"""A blob being received: a sparse data file plus an on-disk have-map.

Chunks are verified before they are written; the file is published into the
store (atomic rename) only when the whole blob verifies.
"""

import errno
import os
import shutil
import threading
from pathlib import Path
from typing import Protocol

import blake3

from links.manifest import Manifest

from links.wire import Code, WireError
from reticulum_grid.store.names import check_content

from reticulum_grid.store.blobinfo import BlobInfo


class Home(Protocol):
    """What a Partial asks of the store receiving it (store/blobstore.py's BlobStore)."""
    root: Path

    def has(self, blob_id: bytes) -> bool: ...

    def info(self, blob_id: bytes) -> BlobInfo | None: ...

    def publish(self, blob_id: bytes, manifest_bytes: bytes, data_path: Path) -> None: ...

    def set_alias(self, alias: str, blob_id: bytes, kind: str | None = None) -> None: ...

    def set_kind_if_new(self, blob_id: bytes, kind: str) -> None: ...

    def released(self, partial: "Partial") -> bool: ...

#: Room kept free on the store's disk beyond a blob's size (bytes).
DISK_MARGIN = 256 << 20


def storage_error(error: OSError, path: str | Path) -> WireError:
    """WireError for an OSError met writing ``path``: insufficient_storage when
    the disk (or a quota) is full, else internal, naming the file either way."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return WireError(Code.INSUFFICIENT_STORAGE, f"disk full writing {path}")
    return WireError(Code.INTERNAL, f"cannot write {path}: {error.strerror or error}")


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """os.pwrite until every byte is written (a nearly full disk writes short,
    then raises ENOSPC)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


class Partial:
    """A blob being received: sparse data file plus an on-disk have-map, so an
    interrupted transfer resumes without re-fetching verified chunks.
    ``write`` may be called from several threads."""

    def __init__(self, store: Home, blob_id: bytes, manifest_bytes: bytes, manifest: Manifest) -> None:
        self.store = store
        self.blob_id = blob_id
        self.manifest = manifest
        self._manifest_bytes = manifest_bytes
        self._lock = threading.RLock()
        self._data_fd: int | None = None
        self._have_fd: int | None = None
        self.users = 0
        self.dir = store.root / "partial" / blob_id.hex()
        self.complete = store.has(blob_id)
        if self.complete:
            self.have = bytearray(b"\x01" * len(manifest.chunks))
            return
        self._need_room()
        try:
            self._open(manifest_bytes)
        except OSError as e:
            self._close_files()
            raise storage_error(e, self.dir) from None

    def _open(self, manifest_bytes: bytes) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "manifest").write_bytes(manifest_bytes)
        data = self.dir / "data"
        with open(data, "ab") as f:
            f.truncate(self.manifest.total_size)
        have_path = self.dir / "have"
        chunks = len(self.manifest.chunks)
        have = have_path.read_bytes() if have_path.exists() else b""
        self.have = bytearray(have[:chunks].ljust(chunks, b"\x00"))
        have_path.write_bytes(bytes(self.have))
        self._data_fd = os.open(data, os.O_RDWR)
        self._have_fd = os.open(have_path, os.O_RDWR)

    def _need_room(self) -> None:
        already = self.dir / "data"
        present = already.stat().st_blocks * 512 if already.exists() else 0
        need = self.manifest.total_size - present + DISK_MARGIN
        free = shutil.disk_usage(self.store.root).free
        if need > free:
            raise WireError(Code.INSUFFICIENT_STORAGE,
                            f"blob needs {need >> 20} MiB (with margin), {free >> 20} MiB free here")

    def missing(self) -> list[int]:
        return [i for i, v in enumerate(self.have) if not v]

    @property
    def bytes_done(self) -> int:
        return sum(n for (_, n), v in zip(self.manifest.chunks, self.have) if v)

    def write(self, index: int, data: bytes) -> None:
        """Verify chunk ``index`` against the manifest and write it.
        Raises WireError(bad_chunk) when it does not match."""
        digest, length = self.manifest.chunks[index]
        if len(data) != length or blake3.blake3(data).digest() != digest:
            raise WireError(Code.BAD_CHUNK, f"chunk {index} does not match its manifest hash")
        with self._lock:
            if self.complete or self.have[index]:
                return  # another transfer of this blob got there first
            if self._data_fd is None or self._have_fd is None:
                raise WireError(Code.INCOMPLETE, "this transfer was closed")
            try:
                _pwrite_all(self._data_fd, data, self.manifest.chunk_offset(index))
                os.pwrite(self._have_fd, b"\x01", index)  # only after the data is written
            except OSError as e:
                raise storage_error(e, self.dir / "data") from None
            self.have[index] = 1

    def finish(self, alias: str | None = None, kind: str | None = None) -> BlobInfo | None:
        """Verify the whole file and publish it under objects/ (atomic rename).

        Chunks that no longer verify are marked missing again and WireError(bad_chunk)
        is raised. Several transfers of one blob may call this; one publishes.
        ``kind`` applies only to a blob new to this store. Returns BlobInfo."""
        with self._lock:
            if not self.complete:
                if self.missing():
                    raise WireError(Code.INCOMPLETE, f"{len(self.missing())} chunks still missing")
                if self._data_fd is None or self._have_fd is None:
                    raise WireError(Code.INCOMPLETE, "this transfer was closed")
                try:
                    os.fsync(self._data_fd)
                except OSError as e:
                    raise storage_error(e, self.dir / "data") from None
                bad = self._verify_all()
                if bad:
                    for index in bad:
                        self.have[index] = 0
                        os.pwrite(self._have_fd, b"\x00", index)
                    raise WireError(Code.BAD_CHUNK, f"chunks {bad[:8]} failed the final check")
                self._close_files()
                try:
                    check_content(self.dir / "data", kind)
                except WireError:
                    shutil.rmtree(self.dir, ignore_errors=True)  # verified, but not what it claims to be
                    self.have = bytearray(len(self.have))
                    raise
                self.store.publish(self.blob_id, self._manifest_bytes, self.dir / "data")
                shutil.rmtree(self.dir, ignore_errors=True)
                self.complete = True
        if alias:
            self.store.set_alias(alias, self.blob_id, kind)
        elif kind:
            self.store.set_kind_if_new(self.blob_id, kind)
        return self.store.info(self.blob_id)

    def _verify_all(self) -> list[int]:
        bad = []
        with open(self.dir / "data", "rb") as f:
            for index, (digest, length) in enumerate(self.manifest.chunks):
                if blake3.blake3(f.read(length)).digest() != digest:
                    bad.append(index)
        return bad

    @property
    def closed(self) -> bool:
        return self.complete or self._data_fd is None

    def release(self) -> None:
        """A transfer is done with this Partial; the last one closes its files
        (after the store stops handing it out, so none is given a closed one)."""
        if self.store.released(self):
            with self._lock:
                self._close_files()

    def _close_files(self) -> None:
        for name in ("_data_fd", "_have_fd"):
            fd = getattr(self, name, None)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)
