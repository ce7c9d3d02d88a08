"""Blob manifests: content addressing for models, adapters and datasets.

A blob is split into fixed-size chunks (``chunk_size`` bytes, the last one
shorter). Its manifest is the msgpack array::

    [1, chunk_size, total_size, [[blake3(chunk) (32 bytes), chunk length], ...]]

and the blob id is BLAKE3(manifest bytes) (32 bytes). Human aliases point at
blob ids; a short id (first 4 bytes) names a blob in caps.
"""

import os
from dataclasses import dataclass

import blake3
import msgpack

VERSION = 1
CHUNK_SIZE = 1 << 20  # 1 MiB: a 64 MB blob is 64 chunks, a 20 GB model ~20k (manifest ~0.7 MB)
MIN_CHUNK_SIZE = 1 << 12
MAX_CHUNK_SIZE = 1 << 26
HASH_BYTES = 32
MAX_MANIFEST_BYTES = 1 << 24


class ManifestError(ValueError):
    pass


@dataclass(frozen=True)
class Manifest:
    chunk_size: int
    total_size: int
    chunks: tuple[tuple[bytes, int], ...]  # ((hash bytes, length), ...)

    def pack(self) -> bytes:
        return msgpack.packb([VERSION, self.chunk_size, self.total_size,
                              [[h, n] for h, n in self.chunks]], use_bin_type=True)

    @property
    def blob_id(self) -> bytes:
        return blake3.blake3(self.pack()).digest()

    def chunk_offset(self, index: int) -> int:
        return index * self.chunk_size


def build(path: str | os.PathLike[str], chunk_size: int = CHUNK_SIZE) -> Manifest:
    """Manifest of the file at ``path`` (reads it once)."""
    chunks, total = [], 0
    with open(path, "rb") as f:
        while True:
            data = f.read(chunk_size)
            if not data:
                break
            chunks.append((blake3.blake3(data).digest(), len(data)))
            total += len(data)
    return Manifest(chunk_size, total, tuple(chunks))


def unpack(data: object, expected_id: bytes | None = None) -> Manifest:
    """Parse and check a manifest. With ``expected_id`` the bytes must hash to it.

    Raises ManifestError on malformed data, inconsistent sizes or a wrong id."""
    if not isinstance(data, (bytes, bytearray)) or len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError("manifest must be bytes of at most 16 MiB")
    if expected_id is not None and blake3.blake3(bytes(data)).digest() != expected_id:
        raise ManifestError("manifest does not hash to its blob id")
    try:
        version, chunk_size, total, chunks = msgpack.unpackb(bytes(data), raw=False)
    except Exception as e:
        raise ManifestError(f"malformed manifest: {e}") from None
    if version != VERSION:
        raise ManifestError(f"unsupported manifest version {version!r}")
    if not isinstance(chunk_size, int) or not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
        raise ManifestError("chunk size out of range")
    if not isinstance(chunks, list) or not isinstance(total, int) or total < 0:
        raise ManifestError("malformed chunk list")
    parsed = []
    for i, entry in enumerate(chunks):
        if (not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], bytes)
                or len(entry[0]) != HASH_BYTES or not isinstance(entry[1], int)):
            raise ManifestError(f"malformed chunk entry {i}")
        last = i == len(chunks) - 1
        if not (0 < entry[1] <= chunk_size) or (not last and entry[1] != chunk_size):
            raise ManifestError(f"chunk {i} has size {entry[1]}")
        parsed.append((entry[0], entry[1]))
    if sum(n for _, n in parsed) != total:
        raise ManifestError("chunk sizes do not add up to the total size")
    return Manifest(chunk_size, total, tuple(parsed))
