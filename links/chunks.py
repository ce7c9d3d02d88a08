"""Chunk transfer over a Link's Channel, in either direction.

Message types (msgpack arrays):

- ``ChunkRequest``  0x0201 ``[xfer_id, blob_id, [index, ...]]`` (at most MAX_INDICES)
- ``ChunkData``     0x0202 ``[xfer_id, index, offset, bytes]`` - a chunk is sent as
  consecutive pieces sized to the Link's negotiated MDU, in the requested order
- ``ChunkError``    0x0203 ``[xfer_id, index, code, message]`` - one chunk cannot be
  served (index -1: the whole request)
- ``ChunkCancel``   0x0204 ``[xfer_id]``
- ``TransferProgress`` 0x0205 ``[xfer_id, done_bytes, total_bytes]`` and
  ``TransferEnd`` 0x0206 ``[xfer_id, ok, code, message, report]``: a tower
  receiving a blob reports to the client that asked for it.

Why Channel messages and not one RNS Resource per chunk: measured on loopback
TCP with rns 0.9.4, 64 KiB Channel messages moved 64 MiB at ~80 MB/s against
~60 MB/s for a Resource (which also bz2-compresses by default and, made from a
whole file, holds it in memory); on a 500-byte-MTU radio link the Channel's
messages shrink with the MDU.
"""

import logging
import queue
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Self

import RNS

from links.channel import (
    MAX_ID,
    ChannelRouter,
    ProtocolError,
    get_alive,
    uint,
)
from links.manifest import Manifest
from links.message import Message, bytes_field, checked, checked_new, free_text, map_field, text_field, uint_field
from links.wire import Code, WireError

log = logging.getLogger("rngrid.links")

MAX_INDICES = 1024
#: Most source towers one ``blobs/pull`` request may name.
MAX_PULL_SOURCES = 16
DATA_OVERHEAD = 40  # ChunkData's own fields: array header, ids, offset, bin header
#: Seconds without data before a fetch gives up on its source, at least (more
#: on a slow link: ChunkFetcher.fetch).
CHUNK_IDLE_S = 30.0


def _blob_id(value: object) -> bytes:
    if not isinstance(value, bytes) or len(value) != 32:
        raise ProtocolError("blob id must be 32 bytes")
    return value


def _indices(value: object) -> list[int]:
    if not isinstance(value, list) or not 0 < len(value) <= MAX_INDICES:
        raise ProtocolError(f"a chunk request names 1..{MAX_INDICES} chunks")
    return [uint(i, "chunk index", 1 << 31) for i in value]


def _error_index(value: object) -> int:
    """A chunk index, or -1 for the whole request."""
    if not isinstance(value, int) or isinstance(value, bool) or not -1 <= value < 1 << 31:
        raise ProtocolError("chunk index is not an integer")
    return value


def _end_ok(value: object) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError("malformed transfer end")
    return value


@dataclass
class _Transfer(Message):
    """A chunk-protocol message: the transfer it belongs to comes first."""
    xfer_id: int = uint_field("transfer id")


@dataclass
class ChunkRequest(_Transfer):
    MSGTYPE = 0x0201
    blob_id: bytes = checked(_blob_id, b"")
    indices: list[int] = checked_new(_indices, list)


@dataclass
class ChunkData(_Transfer):
    MSGTYPE = 0x0202
    index: int = uint_field("chunk index", 1 << 31)
    offset: int = uint_field("offset", 1 << 40)
    data: bytes = bytes_field("chunk data")


@dataclass
class ChunkError(_Transfer):
    MSGTYPE = 0x0203
    index: int = checked(_error_index, -1)
    code: str = text_field("code", 64)
    message: str = free_text(overhead=48)


@dataclass
class ChunkCancel(_Transfer):
    MSGTYPE = 0x0204


@dataclass
class TransferProgress(_Transfer):
    MSGTYPE = 0x0205
    done: int = uint_field("done", 1 << 50)
    total: int = uint_field("total", 1 << 50)


@dataclass
class TransferEnd(_Transfer):
    MSGTYPE = 0x0206
    ok: bool = checked(_end_ok, False)
    code: str = text_field("code", 64)
    message: str = free_text(overhead=48)
    report: dict[str, Any] = map_field("malformed transfer end")

    def fit(self, limit: int) -> Self:
        """Without the report (the client can ask caps/full), and with a shorter message."""
        return replace(super().fit(limit), report={})


class ChunkServer:
    """Serves ChunkRequests that arrive on one Link, at most MAX_ACTIVE at once.

    ``read_chunk(blob_id, index) -> bytes`` and ``authorize(blob_id)`` raise
    WireError; each refusal goes back as a ChunkError and the Link stays up."""

    MAX_ACTIVE = 4

    def __init__(self, router: ChannelRouter, read_chunk: Callable[[bytes, int], bytes],
                 authorize: Callable[[bytes], None]) -> None:
        self.router = router
        self.read_chunk = read_chunk
        self.authorize = authorize
        self._active: set[int] = set()
        self._cancelled: set[int] = set()
        self._lock = threading.Lock()
        router.on(ChunkRequest, self._request)
        router.on(ChunkCancel, self._cancel)

    def _cancel(self, message: ChunkCancel) -> None:
        with self._lock:
            if message.xfer_id in self._active:  # only running transfers: the set stays small
                self._cancelled.add(message.xfer_id)

    def _request(self, request: ChunkRequest) -> None:
        try:
            self.authorize(request.blob_id)  # before any serving thread: a refusal reads nothing
            with self._lock:
                if request.xfer_id in self._active:
                    raise WireError(Code.BAD_REQUEST, f"transfer {request.xfer_id} is already running on this link")
                if len(self._active) >= self.MAX_ACTIVE:
                    raise WireError(Code.BUSY, f"{self.MAX_ACTIVE} chunk requests already running on this link")
                self._active.add(request.xfer_id)
        except WireError as e:
            threading.Thread(target=self.router.send, args=(ChunkError(request.xfer_id, -1, e.code, e.message),),
                             daemon=True).start()
            return
        threading.Thread(target=self._serve, args=(request,), name="rngrid-chunks", daemon=True).start()

    def _serve(self, request: ChunkRequest) -> None:
        try:
            self._send_chunks(request)
        finally:
            with self._lock:
                self._active.discard(request.xfer_id)
                self._cancelled.discard(request.xfer_id)

    def _send_chunks(self, request: ChunkRequest) -> None:
        limit = self.router.payload_limit(DATA_OVERHEAD)
        for index in request.indices:
            if request.xfer_id in self._cancelled:
                break
            try:
                data = self.read_chunk(request.blob_id, index)
            except WireError as e:
                if not self.router.send(ChunkError(request.xfer_id, index, e.code, e.message)):
                    return
                continue
            for offset in range(0, len(data), limit):
                if not self.router.send(ChunkData(request.xfer_id, index, offset, data[offset:offset + limit])):
                    return


class ChunkFetcher:
    """Fetches chunks of a blob over one Link.

    ``fetch`` yields ``(index, bytes)`` for every requested chunk, in request
    order, each exactly as long as the manifest says; the caller verifies the
    hash (BlobStore's Partial.write). It raises WireError: ``bad_chunk`` when
    the source breaks the protocol (wrong chunk, offset or length), the
    source's own code when it refused a chunk, ``unreachable`` when the Link
    closed, ``timeout`` after ``idle_timeout`` seconds without data (default:
    CHUNK_IDLE_S, or twice the Link's patience_s on a slow link)."""

    def __init__(self, router: ChannelRouter) -> None:
        self.router = router
        self._queues: dict[int, queue.Queue[ChunkData | ChunkError | None]] = {}
        router.on(ChunkData, self._deliver)
        router.on(ChunkError, self._deliver)

    def _deliver(self, message: ChunkData | ChunkError) -> None:
        q = self._queues.get(message.xfer_id)
        if q is not None:
            q.put(message)

    def link_closed(self) -> None:
        for q in list(self._queues.values()):
            q.put(None)

    def fetch(self, blob_id: bytes, manifest: Manifest, indices: Sequence[int],
              idle_timeout: float | None = None) -> Iterator[tuple[int, bytes]]:
        # A source whose Channel window is shut (a radio fade) waits patience_s()
        # for acknowledgements, then resends with backoff: give it that twice over.
        idle_timeout = idle_timeout or max(CHUNK_IDLE_S, 2 * self.router.patience_s())
        xfer_id = secrets.randbelow(MAX_ID)
        q: queue.Queue[ChunkData | ChunkError | None] = queue.Queue()
        self._queues[xfer_id] = q
        done = False
        try:
            if not self.router.send(ChunkRequest(xfer_id, blob_id, list(indices))):
                raise WireError(Code.UNREACHABLE, "link closed")
            for index in indices:
                yield index, self._receive_chunk(q, index, manifest.chunks[index], idle_timeout)
            done = True
        finally:
            self._queues.pop(xfer_id, None)
            if not done and self.router.link.status == RNS.Link.ACTIVE:
                self.router.send(ChunkCancel(xfer_id))

    def _receive_chunk(self, q: queue.Queue[ChunkData | ChunkError | None], index: int, expected: tuple[bytes, int],
                       idle_timeout: float) -> bytes:
        length = expected[1]
        buffer = bytearray()
        while len(buffer) < length:
            message = get_alive(q, self.router, idle_timeout, f"data for chunk {index}")
            if message is None:
                raise WireError(Code.UNREACHABLE, "link closed")
            if isinstance(message, ChunkError):
                raise WireError(message.code, f"chunk {message.index}: {message.message}")
            if message.index != index or message.offset != len(buffer) or len(buffer) + len(message.data) > length:
                raise WireError(Code.BAD_CHUNK, f"source sent chunk {message.index} at offset {message.offset}; "
                                                f"expected chunk {index} at {len(buffer)} (length {length})")
            buffer += message.data
        return bytes(buffer)
