"""llama.cpp's RPC tensor cache on a worker tower, filled only from blobs the tower verified.

``ggml-rpc-server -c`` (tools/rpc/rpc-server.cpp of the vendored llama.cpp)
keeps one file per tensor in ``$LLAMA_CACHE/rpc``, named by the FNV-1a 64 of
the tensor's bytes as 16 lower-case hex digits. Its client
(ggml/src/ggml-rpc/ggml-rpc.cpp: ``rpc_use_hash_cache``) first sends
SET_TENSOR_HASH (that hash) instead of the data for a weight tensor larger
than HASH_THRESHOLD (10 MiB); when the file is there the data never crosses.
The server serves a file as it finds it (no check of its content) and,
after a miss, writes whatever bytes the client then sends. So the tower
keeps the directory itself:

- ``seed`` writes the tensors a worker will hold, read from a blob of the
  tower's store (an external file's chunks verified again against the
  manifest), and records each file's BLAKE3 in ``index.json``;
- ``clean`` removes every file the index does not name (bytes a peer sent)
  and every file whose size or BLAKE3 no longer matches, so a corrupt or
  foreign file is never served once the tower has looked;
- the directory holds at most ``bound`` bytes: the least recently used
  tensors go first.

Measured on the vendored llama.cpp (Q8_0 weights, a coordinator loading
with mmap, its default): the hash a coordinator sends for a tensor is the
FNV-1a 64 of that tensor's bytes in the GGUF file, so seeding from the file
matches. Tensors of 10 MiB or less always cross: llama.cpp sends no hash
for them (none of the bundled 135M model's layer tensors is that large).
"""

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import fnv_c
import gguf

log = logging.getLogger("rngrid.split.cache")

#: ggml-rpc.cpp's HASH_THRESHOLD: tensors larger than this (bytes) are offered by hash.
HASH_THRESHOLD = 10 * 1024 * 1024
#: Default bound of the cache directory (bytes).
DEFAULT_BOUND = 64 << 30
#: The name ggml-rpc-server gives a cached tensor.
CACHE_NAME = re.compile(r"^[0-9a-f]{16}$")
#: read(offset, size) -> the blob's bytes there, verified; raises on a mismatch.
Reader = Callable[[int, int], bytes]


@dataclass(frozen=True)
class Tensor:
    """One tensor to seed: its GGUF name, absolute file offset and size (bytes)."""
    name: str
    offset: int
    size: int


def block_tensors(path: str | os.PathLike[str], blocks: tuple[int, int] | None) -> list[Tensor]:
    """The tensors of ``path`` (a GGUF) that llama.cpp offers by hash, in file
    order: those larger than HASH_THRESHOLD, of blocks [first, end) when
    ``blocks`` is given (``blk.N.*``), else of every block."""
    reader = gguf.GGUFReader(path)
    out = []
    for t in reader.tensors:
        if int(t.n_bytes) <= HASH_THRESHOLD:
            continue
        match = re.match(r"^blk\.(\d+)\.", t.name)
        if match is None or (blocks is not None and not blocks[0] <= int(match.group(1)) < blocks[1]):
            continue
        out.append(Tensor(t.name, int(t.data_offset), int(t.n_bytes)))
    return out


def fnv1a_64(data: bytes) -> str:
    """ggml-rpc's cache name of ``data``: FNV-1a 64 (offset basis 0xcbf29ce484222325), 16 hex digits."""
    return f"{fnv_c.fnv1a_64(data):016x}"


class TensorCache:
    """The RPC tensor cache under ``root`` (the tower makes it 0700): the
    RPC server's LLAMA_CACHE is ``root``, its files are in ``root/rpc``.
    ``bound``: most bytes kept."""

    def __init__(self, root: str | os.PathLike[str], bound: int = DEFAULT_BOUND) -> None:
        self.root = Path(root)
        self.dir = self.root / "rpc"
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        os.chmod(self.dir, 0o700)
        self.bound = bound
        self._index_path = self.root / "index.json"
        self._lock = threading.Lock()
        self._index: dict[str, dict[str, Any]] = self._load()

    @property
    def env(self) -> dict[str, str]:
        """What the RPC server's environment needs to use this cache."""
        return {"LLAMA_CACHE": str(self.root)}

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            index = json.loads(self._index_path.read_text())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in index.items() if CACHE_NAME.match(k) and isinstance(v, dict)} \
            if isinstance(index, dict) else {}

    def _save(self) -> None:
        tmp = self._index_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._index))
        os.replace(tmp, self._index_path)

    def seed(self, tensors: Iterable[Tensor], read: Reader, blob: str = "") -> tuple[int, int]:
        """Write each of ``tensors`` (read with ``read``) that the cache lacks or
        holds other bytes for (each kept file is read back and checked). Returns (tensors now cached, bytes written). A tensor larger than the
        bound is skipped; a read that fails verification stops the seeding
        (the exception propagates; what was written stays, verified)."""
        cached = written = 0
        wanted = [t for t in tensors if t.size <= self.bound]
        self.trim(sum(t.size for t in wanted))
        for tensor in wanted:
            data = read(tensor.offset, tensor.size)
            name = fnv1a_64(data)
            digest = blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest()
            with self._lock:
                entry = self._index.get(name)
                # A file this plan may be served is read back and checked, not trusted from its name.
                if entry is None or entry["blake3"] != digest or not self._intact(self.dir / name, entry, True):
                    tmp = self.root / f".{name}.tmp"
                    tmp.write_bytes(data)
                    os.replace(tmp, self.dir / name)
                    written += len(data)
                self._index[name] = {"blake3": digest, "size": len(data), "blob": blob, "tensor": tensor.name,
                                     "used": time.time()}
                self._save()
            cached += 1
        return cached, written

    def clean(self, verify: bool = True) -> list[str]:
        """Remove the files the index does not name, and (``verify``) those
        whose size or BLAKE3 differs from it. Returns the names removed."""
        removed = []
        with self._lock:
            for path in self.dir.iterdir():
                entry = self._index.get(path.name)
                if entry is None or not self._intact(path, entry, verify):
                    path.unlink(missing_ok=True)
                    self._index.pop(path.name, None)
                    removed.append(path.name)
            for name in [n for n in self._index if not (self.dir / n).exists()]:
                del self._index[name]
            self._save()
        if removed:
            log.info("tensor cache: removed %d file(s) not seeded here or no longer intact", len(removed))
        return removed

    @staticmethod
    def _intact(path: Path, entry: dict[str, Any], verify: bool) -> bool:
        try:
            if path.stat().st_size != entry.get("size"):
                return False
            if not verify:
                return True
            hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
            hasher.update_mmap(path)
            return bool(hasher.hexdigest() == entry.get("blake3"))
        except OSError:
            return False

    def trim(self, room: int = 0) -> None:
        """Remove the least recently used files until ``room`` more bytes fit under the bound."""
        with self._lock:
            total = sum(e["size"] for e in self._index.values())
            for name in sorted(self._index, key=lambda n: self._index[n]["used"]):
                if total + room <= self.bound:
                    break
                (self.dir / name).unlink(missing_ok=True)
                total -= self._index.pop(name)["size"]
            self._save()

    def size(self) -> int:
        """Bytes the cache holds (files the index names)."""
        with self._lock:
            return sum(e["size"] for e in self._index.values())
