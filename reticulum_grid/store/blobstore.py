"""Content-addressed blob store: models, adapters and datasets named by the
BLAKE3 of their manifest (links/manifest.py), with human aliases.

Layout under ``root``::

    objects/<blob id hex>/manifest   packed manifest
    objects/<blob id hex>/data       the verified file (read-only), unless external
    partial/<blob id hex>/manifest   a blob being received ...
    partial/<blob id hex>/data       ... its sparse file, and
    partial/<blob id hex>/have       one byte per chunk: 1 = verified and written
    index.json                       aliases and external files

Paths derive from the hex blob id only, never from an alias, so nothing is
written outside ``root``. A received blob appears under ``objects/`` only
after every chunk verified (atomic rename). "External" blobs are files
registered in place (a tower's configured GGUFs, models imported from other
tools); their chunks are verified again when served because the file is
outside our control, and ``verify`` hashes the whole file again once its size
or mtime moved: a file another program changed is recorded as such (its
index entry's ``changed``: the size and mtime it was found with) and is no
longer listed, a deleted one neither; ``broken`` reports both.
"""

import builtins
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import blake3

from links import manifest as mf
from links.wire import Code, WireError
from reticulum_grid.store.names import KINDS, check_alias, check_content, is_blob_id_prefix
from reticulum_grid.store.blobinfo import BlobInfo
from reticulum_grid.store.partial import Partial

#: A verified blob's mode: read-only (it never changes), and its owner's alone (datasets are private).
READ_ONLY = 0o400


class BlobStore:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        (self.root / "objects").mkdir(parents=True, exist_ok=True)
        (self.root / "partial").mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._index_path = self.root / "index.json"
        self._index = self._load_index()
        self._manifests: dict[bytes, mf.Manifest] = {}
        self._receiving: dict[bytes, Partial] = {}

    # -- index ------------------------------------------------------------
    def _load_index(self) -> dict[str, Any]:
        try:
            data = json.loads(self._index_path.read_text())
        except FileNotFoundError:
            data = {}
        data.setdefault("aliases", {})
        data.setdefault("external", {})
        data.setdefault("kinds", {})
        return data

    def _save_index(self) -> None:
        tmp = self._index_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._index, indent=1, sort_keys=True))
        os.replace(tmp, self._index_path)

    def reload(self) -> None:
        """Re-read the index (another process, e.g. `rngrid models add`, changed it)."""
        with self._lock:
            self._index = self._load_index()

    def index_mtime(self) -> int | None:
        try:
            return self._index_path.stat().st_mtime_ns
        except FileNotFoundError:
            return None

    # -- adding -----------------------------------------------------------
    def add_file(self, path: str | os.PathLike[str], alias: str | None = None, kind: str = "file",
                 copy: bool = False) -> BlobInfo:
        """Register a file as a blob. ``copy`` puts a copy in the store; otherwise
        the file is referenced in place (re-hashed only when its size or mtime
        changes). Returns BlobInfo."""
        if kind not in KINDS:
            raise WireError(Code.BAD_REQUEST, f"kind must be one of {', '.join(KINDS)}")
        if alias is not None:
            self.check_alias_kind(alias, kind)  # before any work: a clash keeps nothing
        path = Path(path).expanduser().resolve()
        if not path.is_file():
            raise WireError(Code.BAD_REQUEST, f"{path} is not a file")
        check_content(path, kind)
        stat = path.stat()
        blob_hex = self._cached_external(path, stat)
        manifest = self.manifest(bytes.fromhex(blob_hex)) if blob_hex else mf.build(path)
        blob_id = manifest.blob_id
        with self._lock:
            self._write_manifest(blob_id, manifest.pack())
            if copy:
                self._copy_in(path, blob_id)
            elif not (self._object_dir(blob_id) / "data").exists():
                self._index["external"][blob_id.hex()] = {"path": str(path), "size": stat.st_size,
                                                          "mtime_ns": stat.st_mtime_ns}
            self._index["kinds"][blob_id.hex()] = kind  # a local add may re-kind a blob on purpose
            self._save_index()
        if alias:
            self.set_alias(alias, blob_id, kind)
        info = self.info(blob_id)
        assert info is not None  # registered just now
        return info

    def verified_in_place(self, path: str | os.PathLike[str]) -> bool:
        """True when the file at ``path`` is registered in place with its
        current size and mtime (so its bytes were hashed as they are)."""
        real = Path(path).expanduser().resolve()
        try:
            return self._cached_external(real, real.stat()) is not None
        except OSError:
            return False

    def _cached_external(self, path: Path, stat: os.stat_result) -> str | None:
        for blob_hex, ext in self._index["external"].items():
            if ext["path"] == str(path) and ext["size"] == stat.st_size and ext["mtime_ns"] == stat.st_mtime_ns:
                return blob_hex
        return None

    def _copy_in(self, path: Path, blob_id: bytes) -> None:
        target = self._object_dir(blob_id) / "data"
        if target.exists():
            return
        tmp = target.with_suffix(".tmp")
        shutil.copyfile(path, tmp)
        os.chmod(tmp, READ_ONLY)
        os.replace(tmp, target)
        self._index["external"].pop(blob_id.hex(), None)

    def check_alias_kind(self, alias: str, kind: str) -> None:
        """Raise WireError(bad_request) if ``alias`` already names a blob of another kind."""
        check_alias(alias)
        with self._lock:
            self._refuse_kind_change(alias, kind)

    def _refuse_kind_change(self, alias: str, kind: str) -> None:
        current = self._index["aliases"].get(alias)
        named = self._index["kinds"].get(current, "file")
        if current is not None and named != kind:
            raise WireError(Code.BAD_REQUEST, f"alias {alias!r} names a {named} here; choose another alias")

    def set_alias(self, alias: str, blob_id: bytes, kind: str | None = None) -> None:
        """Point ``alias`` at ``blob_id``. An alias may move to another blob of
        the same kind (a new version) but never to another kind, and a blob
        keeps the kind it was first stored as. Raises WireError(bad_request)."""
        check_alias(alias)
        with self._lock:
            kinds = self._index["kinds"]
            kind = kinds.get(blob_id.hex()) or kind or "file"
            if kind not in KINDS:
                raise WireError(Code.BAD_REQUEST, f"kind must be one of {', '.join(KINDS)}")
            self._refuse_kind_change(alias, kind)
            self._index["aliases"][alias] = blob_id.hex()
            kinds[blob_id.hex()] = kind
            self._save_index()

    def remove(self, name: str) -> builtins.list[bytes]:
        """Forget ``name``: an alias loses its name, and a blob left without
        aliases (or named by its id) is deleted (a file referenced in place is
        only forgotten, never deleted). Returns the blob ids deleted. Raises
        WireError(unknown_blob)."""
        blob_id = self.resolve(name)
        h = blob_id.hex()
        with self._lock:
            aliases = self._index["aliases"]
            if name in aliases:
                del aliases[name]
            else:
                for alias in [a for a, b in aliases.items() if b == h]:
                    del aliases[alias]
            gone = h not in aliases.values()
            if gone:
                self._index["kinds"].pop(h, None)
                self._index["external"].pop(h, None)
                self._manifests.pop(blob_id, None)
                shutil.rmtree(self._object_dir(blob_id), ignore_errors=True)
            self._save_index()
        return [blob_id] if gone else []

    def set_kind_if_new(self, blob_id: bytes, kind: str) -> None:
        with self._lock:
            if kind in KINDS and blob_id.hex() not in self._index["kinds"]:
                self._index["kinds"][blob_id.hex()] = kind
                self._save_index()

    # -- lookup -----------------------------------------------------------
    def resolve(self, name: str) -> bytes:
        """Blob id for an alias, a full hex id or a unique hex prefix (>= 8).
        Raises WireError(unknown_blob)."""
        with self._lock:
            if name in self._index["aliases"]:
                return bytes.fromhex(self._index["aliases"][name])
            if is_blob_id_prefix(name):
                key = name.lower()
                matches = [h for h in self._known_hex() if h.startswith(key)]
                if len(matches) == 1:
                    return bytes.fromhex(matches[0])
        raise WireError(Code.UNKNOWN_BLOB, f"no blob or alias {name!r} in this store")

    def _known_hex(self) -> set[str]:
        return {p.name for p in (self.root / "objects").iterdir() if (p / "manifest").exists()}

    def has(self, blob_id: bytes) -> bool:
        """True when the whole blob is here and readable (a file registered in
        place: not gone, not known to have changed)."""
        ext = self._index["external"].get(blob_id.hex())
        if ext is not None:
            return _external_problem(ext) is None
        path = self.data_path(blob_id)
        return path is not None and path.exists()

    def data_path(self, blob_id: bytes) -> Path | None:
        ext = self._index["external"].get(blob_id.hex())
        if ext is not None:
            return Path(ext["path"])
        path = self._object_dir(blob_id) / "data"
        return path if path.exists() else None

    def info(self, blob_id: bytes) -> BlobInfo | None:
        """BlobInfo for a complete blob, or None."""
        if not self.has(blob_id):
            return None
        h = blob_id.hex()
        with self._lock:
            aliases = sorted(a for a, b in self._index["aliases"].items() if b == h)
            kind = self._index["kinds"].get(h, "file")
        return BlobInfo(blob_id, self.manifest(blob_id).total_size, kind, aliases, self.data_path(blob_id),
                        h in self._index["external"])

    def list(self) -> builtins.list[BlobInfo]:
        """Every complete blob, as BlobInfo."""
        return [i for i in (self.info(bytes.fromhex(h)) for h in sorted(self._known_hex())) if i]

    def broken(self) -> builtins.list[BlobInfo]:
        """Files registered in place that are gone or changed, as BlobInfo with
        the ``problem`` in words; they are not served until registered again."""
        with self._lock:
            external = dict(self._index["external"])
        found = []
        for h, ext in sorted(external.items()):
            problem = _external_problem(ext)
            if problem is not None:
                with self._lock:
                    aliases = sorted(a for a, b in self._index["aliases"].items() if b == h)
                    kind = self._index["kinds"].get(h, "file")
                found.append(BlobInfo(bytes.fromhex(h), ext["size"], kind, aliases, Path(ext["path"]), True, problem))
        return found

    def verify(self, blob_id: bytes) -> None:
        """Check that a file registered in place still holds ``blob_id``: free
        while its size and mtime are those it was verified with, else it is
        hashed again (about a second per GB: call it off a request handler's
        thread). A blob kept in the store itself passes. Raises
        WireError(corrupt) when the file changed (recorded: the blob is no
        longer listed) or is gone."""
        h = blob_id.hex()
        with self._lock:
            ext = self._index["external"].get(h)
        if ext is None:
            return
        problem = _external_problem(ext)
        if problem is not None:
            raise WireError(Code.CORRUPT, problem)
        stat = os.stat(ext["path"])
        if (stat.st_size, stat.st_mtime_ns) == (ext["size"], ext["mtime_ns"]):
            return
        same = mf.build(ext["path"]).blob_id == blob_id
        with self._lock:
            entry = self._index["external"].get(h)
            if entry is not None and entry["path"] == ext["path"]:
                if same:
                    entry.update(size=stat.st_size, mtime_ns=stat.st_mtime_ns)
                else:
                    entry["changed"] = [stat.st_size, stat.st_mtime_ns]
                self._save_index()
        if not same:
            raise WireError(Code.CORRUPT, f"{ext['path']} changed on disk since it was registered as blob {h[:16]} "
                                          "(another program rewrote it); it is not served until registered again")

    def manifest_bytes(self, blob_id: bytes) -> bytes:
        path = self._object_dir(blob_id) / "manifest"
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise WireError(Code.UNKNOWN_BLOB, f"blob {blob_id.hex()[:16]} is not in this store") from None

    def manifest(self, blob_id: bytes) -> mf.Manifest:
        cached = self._manifests.get(blob_id)
        if cached is None:
            cached = self._manifests[blob_id] = mf.unpack(self.manifest_bytes(blob_id), expected_id=blob_id)
        return cached

    def read_chunk(self, blob_id: bytes, index: int) -> bytes:
        """Bytes of chunk ``index``. Raises WireError: unknown_blob, bad_request
        (index out of range) or corrupt (an external file changed under us)."""
        manifest = self.manifest(blob_id)
        path = self.data_path(blob_id)
        if path is None or not path.exists():
            raise WireError(Code.UNKNOWN_BLOB, f"blob {blob_id.hex()[:16]} is not complete here")
        if not isinstance(index, int) or not 0 <= index < len(manifest.chunks):
            raise WireError(Code.BAD_REQUEST, f"chunk index {index} out of range 0..{len(manifest.chunks) - 1}")
        digest, length = manifest.chunks[index]
        with open(path, "rb") as f:
            f.seek(manifest.chunk_offset(index))
            data = f.read(length)
        if blob_id.hex() in self._index["external"] and blake3.blake3(data).digest() != digest:
            raise WireError(Code.CORRUPT, f"chunk {index} of {path} changed on disk")
        return data

    def read_verified(self, blob_id: bytes, offset: int, size: int) -> bytes:
        """``size`` bytes of the blob from byte ``offset``, every chunk they
        touch checked against the manifest (BLAKE3), external or not. Raises
        WireError: unknown_blob, bad_request (outside the blob) or corrupt."""
        manifest = self.manifest(blob_id)
        if offset < 0 or size < 0 or offset + size > manifest.total_size:
            raise WireError(Code.BAD_REQUEST, f"bytes {offset}+{size} are outside the blob")
        out = bytearray()
        index = offset // manifest.chunk_size
        while len(out) < size:
            data = self.read_chunk(blob_id, index)
            if blake3.blake3(data).digest() != manifest.chunks[index][0]:
                raise WireError(Code.CORRUPT, f"chunk {index} of blob {blob_id.hex()[:16]} does not match its manifest")
            start = offset + len(out) - manifest.chunk_offset(index)
            out += data[start:start + size - len(out)]
            index += 1
        return bytes(out)

    # -- receiving --------------------------------------------------------
    def receive(self, blob_id: bytes, manifest_bytes: bytes) -> Partial:
        """Start or resume receiving a blob. Checks that the manifest hashes to
        ``blob_id`` and that the disk has room. Returns a Partial."""
        try:
            manifest = mf.unpack(manifest_bytes, expected_id=blob_id)
        except mf.ManifestError as e:
            raise WireError(Code.BAD_MANIFEST, str(e)) from None
        with self._lock:
            partial = self._receiving.get(blob_id)
            if partial is None or partial.closed:
                partial = self._receiving[blob_id] = Partial(self, blob_id, manifest_bytes, manifest)
            partial.users += 1  # concurrent transfers of one blob share it; see Partial.release
            return partial

    def _object_dir(self, blob_id: bytes) -> Path:
        return self.root / "objects" / blob_id.hex()

    def _write_manifest(self, blob_id: bytes, data: bytes) -> None:
        directory = self._object_dir(blob_id)
        directory.mkdir(parents=True, exist_ok=True)
        if not (directory / "manifest").exists():
            tmp = directory / "manifest.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, directory / "manifest")

    def released(self, partial: Partial) -> bool:
        """One transfer is done with ``partial`` (Partial.release): True when it
        was the last, once the store no longer hands it out."""
        with self._lock:
            partial.users -= 1
            if partial.users > 0:
                return False
            if self._receiving.get(partial.blob_id) is partial:
                del self._receiving[partial.blob_id]
            return True

    def publish(self, blob_id: bytes, manifest_bytes: bytes, data_path: Path) -> None:
        """Move a verified partial file into objects/ (atomic rename); a Partial's finish() calls it."""
        with self._lock:
            directory = self._object_dir(blob_id)
            directory.mkdir(parents=True, exist_ok=True)
            os.chmod(data_path, READ_ONLY)
            os.replace(data_path, directory / "data")
            self._write_manifest(blob_id, manifest_bytes)


def _external_problem(ext: dict[str, Any]) -> str | None:
    """Why the file of external entry ``ext`` is not served (gone, or found
    changed by ``verify``), None when it may be. One stat."""
    try:
        stat = os.stat(ext["path"])
    except OSError:
        return f"{ext['path']} is gone (another program deleted or moved it)"
    if ext.get("changed") == [stat.st_size, stat.st_mtime_ns]:
        return f"{ext['path']} changed since it was registered (another program rewrote it)"
    return None
