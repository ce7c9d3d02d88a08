"""Fetching one blob from one or several sources into a BlobStore.

Every source gets its own worker; workers take batches of missing chunks from
one shared queue, so each chunk comes from exactly one source and a fast
source takes more. A source that fails (link gone, refusal, timeout) hands its
unfinished batch back and stops; one whose data does not verify is a lying
source: it is dropped for the rest of the transfer and named in the report.
Chunks already verified in an earlier, interrupted transfer are never fetched
again (the store's have-map).
"""

import logging
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from links.manifest import Manifest
from links.wire import Code, WireError
from reticulum_grid.store.names import is_blob_id_prefix, parse_blob_id

if TYPE_CHECKING:
    from reticulum_grid.node.connection import TowerConnection
    from reticulum_grid.store.blobstore import BlobInfo, BlobStore
    from reticulum_grid.store.partial import Partial

log = logging.getLogger("rngrid.sync")

#: Chunks per request to one source: enough to keep a fast link busy while
#: leaving work for the other sources.
BATCH = 8
#: Extra rounds allowed when the final whole-file check finds bad chunks again.
MAX_ROUNDS = 3
#: A source that answers "busy" (its link already serves ChunkServer.MAX_ACTIVE
#: requests) is asked again after BUSY_PAUSE_S, at most BUSY_TRIES times.
BUSY_PAUSE_S = 0.5
BUSY_TRIES = 60
#: A pull or push estimated to take longer than this is refused unless forced (seconds).
MAX_TRANSFER_S = 600.0
#: Links RNS measured below this rate while setting them up (bits/s) are
#: radio-class: the set-up packets' airtime is most of that round trip, so the
#: measured rate is close to the link's (lora-fast, 5.5 kbit/s: ~2 kbit/s
#: measured). On faster links latency dominates the set-up (a 40 ms tailnet
#: measures ~40 kbit/s) and the figure says nothing about the rate: no estimate.
SLOW_SETUP_BPS = 10_000


@dataclass
class SyncReport:
    """What one sync did. Sizes in bytes, time in seconds."""
    blob_id: bytes
    size: int
    chunks: int
    reused: int = 0
    fetched: dict[str, int] = field(default_factory=dict)  # source name -> chunks it gave
    failed_sources: dict[str, str] = field(default_factory=dict)  # source name -> "code: message"
    lying_sources: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_map(self) -> dict[str, Any]:
        return {"blob_id": self.blob_id.hex(), "size": self.size, "chunks": self.chunks, "reused": self.reused,
                "fetched": dict(self.fetched), "failed_sources": dict(self.failed_sources),
                "lying_sources": list(self.lying_sources), "seconds": round(self.seconds, 3)}


#: ``progress(done_bytes, total_bytes)``.
Progress = Callable[[int, int], None]


class ChunkSource(Protocol):
    """What fetch_blob takes chunks from."""
    name: str

    def connect(self) -> None:
        """Raise WireError when the source cannot be reached."""

    def fetch(self, blob_id: bytes, manifest: Manifest, indices: list[int]) -> Iterable[tuple[int, bytes]]:
        """(index, data) for each chunk of ``indices`` it sends; raises WireError."""
        ...


class LinkSource:
    """A source reached over a TowerConnection. A source is anything with a
    ``name``, ``connect()`` (raises WireError when unreachable) and ``fetch``."""

    def __init__(self, connection: "TowerConnection") -> None:
        self.connection = connection
        self.name = connection.name

    def connect(self) -> None:
        self.connection.ensure_link()

    def fetch(self, blob_id: bytes, manifest: Manifest, indices: list[int]) -> Iterable[tuple[int, bytes]]:
        return self.connection.fetch(blob_id, manifest, indices)


def first_manifest(connections: "Sequence[TowerConnection]", name: str, timeout: float = 20.0) -> dict[str, Any]:
    """The first ``blobs/manifest`` reply for ``name`` from any of ``connections``,
    asked all at once (an unreachable source must not hold up the others).
    Raises WireError naming every source's refusal."""
    answers: queue.Queue[tuple[TowerConnection, dict[str, Any] | None, WireError | None]] = queue.Queue()

    def ask(conn: "TowerConnection") -> None:
        try:
            answers.put((conn, conn.request("blobs/manifest", {"name": name}), None))
        except WireError as e:
            answers.put((conn, None, e))

    for conn in connections:
        threading.Thread(target=ask, args=(conn,), name="rngrid-manifest", daemon=True).start()
    errors: list[tuple[TowerConnection, WireError | None]] = []
    deadline = time.monotonic() + timeout
    for _ in connections:
        try:
            conn, reply, error = answers.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if reply is not None:
            return reply
        errors.append((conn, error))
    if len(connections) == 1 and errors and errors[0][1] is not None:
        raise errors[0][1]
    named = "; ".join(f"{conn.name}: {error}" for conn, error in errors) or "no answer"
    raise WireError(Code.UNKNOWN_BLOB, f"no source gave the manifest of {name!r}: {named}")


def matching_blob_id(name: str, reply: dict[str, Any]) -> bytes:
    """The blob id of a ``blobs/manifest`` reply for ``name``; when ``name`` is a
    blob id (prefix), the reply must be for that blob. Raises WireError."""
    blob_id = parse_blob_id(reply.get("blob_id"))
    if is_blob_id_prefix(name) and not blob_id.hex().startswith(name.lower()):
        raise WireError(Code.BAD_MANIFEST, f"asked for blob {name}, the source answered with {blob_id.hex()[:16]}")
    return blob_id


def fetch_blob(store: "BlobStore", blob_id: bytes, manifest_bytes: bytes, sources: Iterable[ChunkSource],
               alias: str | None = None, kind: str | None = None,
               progress: Progress | None = None) -> "tuple[BlobInfo | None, SyncReport]":
    """Complete ``blob_id`` in ``store`` from ``sources``.

    ``progress(done_bytes, total_bytes)`` is called after every chunk. Returns
    (BlobInfo, SyncReport); raises WireError(incomplete) naming every source's
    failure when the sources ran out before the blob was complete, or
    WireError(insufficient_storage) when this store's disk filled up (what was
    verified stays for the next try either way)."""
    started = time.monotonic()
    partial = store.receive(blob_id, manifest_bytes)
    try:
        return _fetch(partial, sources, alias, kind, progress, started)
    finally:
        partial.release()


def _fetch(partial: "Partial", sources: Iterable[ChunkSource], alias: str | None, kind: str | None,
           progress: Progress | None, started: float) -> "tuple[BlobInfo | None, SyncReport]":
    blob_id = partial.blob_id
    chunks = len(partial.manifest.chunks)
    report = SyncReport(blob_id, partial.manifest.total_size, chunks, reused=chunks - len(partial.missing()))
    live = list(sources)
    # Each round either finishes the queue or loses a source, so this ends.
    for _ in range(len(live) + MAX_ROUNDS):
        missing = partial.missing()
        if missing:
            if not live:
                break
            live = _round(partial, missing, live, report, progress)
            continue
        try:
            info = partial.finish(alias=alias, kind=kind)
            report.seconds = time.monotonic() - started
            return info, report
        except WireError as e:
            if e.code != Code.BAD_CHUNK:
                raise
            log.warning("final check of %s: %s", blob_id.hex()[:16], e.message)
    reasons = "; ".join(f"{name}: {why}" for name, why in report.failed_sources.items()) or "no sources"
    raise WireError(Code.INCOMPLETE, f"{len(partial.missing())} of {chunks} chunks still missing ({reasons})")


def _round(partial: "Partial", missing: list[int], sources: list[ChunkSource], report: SyncReport,
           progress: Progress | None) -> list[ChunkSource]:
    todo = deque(missing)
    lock = threading.Lock()
    fetched = Counter(report.fetched)
    done = [partial.bytes_done]
    total = partial.manifest.total_size
    healthy: list[ChunkSource] = []
    stop: list[WireError] = []  # a failure of our own store (disk full): no source can help, every worker stops

    def work(source: ChunkSource) -> None:
        try:
            source.connect()  # before taking chunks, so an unreachable source holds none
        except WireError as e:
            with lock:
                report.failed_sources[source.name] = f"{e.code}: {e.message}"
            return
        busy_tries = BUSY_TRIES
        while True:
            with lock:
                if stop:
                    return
                if not todo:
                    healthy.append(source)
                    return
                batch = [todo.popleft() for _ in range(min(BATCH, len(todo)))]
            pending = list(batch)
            try:
                for index, data in source.fetch(partial.blob_id, partial.manifest, batch):
                    try:
                        partial.write(index, data)
                    except WireError as e:
                        if e.code != Code.BAD_CHUNK:
                            stop.append(e)
                        raise
                    pending.remove(index)
                    with lock:
                        fetched[source.name] += 1
                        done[0] += len(data)
                        now = done[0]
                    if progress:
                        progress(now, total)
            except WireError as e:
                with lock:
                    todo.extendleft(reversed(pending))
                if stop:
                    return
                if e.code == Code.BUSY and busy_tries > 0:
                    busy_tries -= 1
                    log.info("source %s busy; asking it again in %.1f s", source.name, BUSY_PAUSE_S)
                    time.sleep(BUSY_PAUSE_S)
                    continue
                with lock:
                    report.failed_sources[source.name] = f"{e.code}: {e.message}"
                    if e.code == Code.BAD_CHUNK:
                        report.lying_sources.append(source.name)
                log.warning("source %s dropped: %s", source.name, e)
                return

    threads = [threading.Thread(target=work, args=(s,), name=f"rngrid-sync-{s.name}", daemon=True) for s in sources]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report.fetched = dict(fetched)
    if stop:
        raise stop[0]  # the verified chunks stay for the next try
    return healthy


def measured_bps(connections: "Iterable[TowerConnection]") -> float | None:
    """The rate of the Links of ``connections`` (TowerConnection) as RNS
    measured it while setting them up, in bits/s summed over sources; None if
    unknown."""
    rates = [c.link.get_establishment_rate() for c in connections if c.link is not None]
    return sum(r for r in rates if r) or None


def estimate_s(nbytes: int, rate_bps: float | None) -> float | None:
    """Seconds to move ``nbytes`` over a radio-class link measured at
    ``rate_bps`` (bits/s); None when the rate is unknown or not radio-class.
    Errs long: the set-up rate counts the round trip's latency too."""
    if not rate_bps or rate_bps >= SLOW_SETUP_BPS:
        return None
    return nbytes * 8 / rate_bps


def check_duration(nbytes: int, rate_bps: float | None, what: str,
                   limit_s: float | None = MAX_TRANSFER_S) -> float | None:
    """Raise WireError(too_slow), with the estimate, when moving ``nbytes``
    at ``rate_bps`` (bits/s) would take longer than ``limit_s`` seconds
    (None: no limit). Returns the estimate in seconds (None: rate unknown)."""
    seconds = estimate_s(nbytes, rate_bps)
    if seconds is not None and rate_bps and limit_s is not None and seconds > limit_s:
        raise WireError(Code.TOO_SLOW, f"{what}: {nbytes / 1e6:.2f} MB at the measured {rate_bps / 1000:.1f} kbit/s "
                                       f"would take about {_duration(seconds)} (limit {_duration(limit_s)}); "
                                       "use --force to send it anyway")
    return seconds


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
