"""A tower's blob commands (role ``sync``).

``blobs/manifest`` ``{"name": alias or blob id hex}`` ->
    ``{"blob_id", "manifest", "size", "kind", "aliases"}``
``blobs/push`` ``{"blob_id", "manifest", "alias"?, "kind"?, "xfer_id"}`` -> ``{"have", "missing"}``:
    the tower then fetches the missing chunks from the pusher over the same
    Link (the pusher serves them) and reports TransferProgress / TransferEnd.
``blobs/pull`` ``{"name": alias or blob id hex, "sources": [destination hash, ...], "alias"?,
    "kind"?, "xfer_id"}`` -> ``{"have"}``: the tower asks the sources for the
    manifest, fetches from all of them (they must grant it ``sync``) and
    reports to the asking Link the same way.

The reply comes at once; the transfer runs on its own thread.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

from announce.announcer import Announcer

from links.commands import Command, bind
from links.chunks import MAX_PULL_SOURCES, TransferEnd, TransferProgress
from links.manifest import Manifest
from links.stream import MAX_STREAM_ID
from links.wire import Code, Field, WireError, in_range, max_len, validate
from reticulum_grid.store.names import KINDS, parse_blob_id
from reticulum_grid.node.connection import TowerConnection
from reticulum_grid.store.blobstore import BlobInfo
from reticulum_grid.store.sync import LinkSource, Progress, SyncReport, fetch_blob, first_manifest, matching_blob_id

if TYPE_CHECKING:
    from reticulum_grid.tower.session import LinkSession
    from reticulum_grid.tower.parts import TowerParts

#: A transfer run on its own thread: the progress callback in, what fetch_blob gives out.
Transfer = Callable[[Progress], "tuple[BlobInfo | None, SyncReport]"]

log = logging.getLogger("rngrid.tower")

#: Progress messages per second at most, whatever the chunk rate.
PROGRESS_HZ = 4

_kind = Field(str, default="model", check=lambda v: None if v in KINDS else f"kind must be one of {', '.join(KINDS)}")
_xfer = Field(int, required=True, check=in_range(0, MAX_STREAM_ID))
PUSH = {"blob_id": Field((bytes, str), required=True), "manifest": Field(bytes, required=True),
        "alias": Field(str), "kind": _kind, "xfer_id": _xfer}
PULL = {"name": Field(str, required=True, check=max_len(128)), "sources": Field(list, required=True),
        "alias": Field(str), "kind": _kind, "xfer_id": _xfer}


class SessionSource:
    """The client at the other end of a tower's Link, as a chunk source (push)."""

    def __init__(self, session: "LinkSession") -> None:
        self.session = session
        identity = session.identity
        self.name = f"client {identity.hash.hex()[:8]}" if identity else "client"

    def connect(self) -> None:
        self.session.router.check_alive()

    def fetch(self, blob_id: bytes, manifest: Manifest, indices: list[int]) -> Iterable[tuple[int, bytes]]:
        return self.session.fetcher.fetch(blob_id, manifest, indices)


class TowerBlobs:
    def __init__(self, tower: "TowerParts") -> None:
        self.tower = tower
        self.store = tower.store
        self.peers: dict[bytes, TowerConnection] = {}

    def commands(self) -> list[Command]:
        return [bind("blobs/manifest", self.manifest), bind("blobs/push", self.push), bind("blobs/pull", self.pull)]

    def manifest(self, session: "LinkSession", request: dict[str, Any]) -> dict[str, Any]:
        name = validate(request, {"name": Field(str, required=True, check=max_len(128))})["name"]
        blob_id = self.store.resolve(name)
        info = self.store.info(blob_id)
        if info is None:
            raise WireError(Code.UNKNOWN_BLOB, f"blob {name!r} is not complete on this tower")
        return {"blob_id": blob_id, "manifest": self.store.manifest_bytes(blob_id), "size": info.size,
                "kind": info.kind, "aliases": info.aliases}

    def push(self, session: "LinkSession", request: dict[str, Any]) -> dict[str, Any]:
        r = validate(request, PUSH)
        blob_id, alias = parse_blob_id(r["blob_id"]), self.tower.remote_alias(r["alias"], r["kind"])
        partial = self.store.receive(blob_id, r["manifest"])  # checks the manifest and the free disk
        have, missing = partial.complete, len(partial.missing())
        partial.release()
        self._start(session, r["xfer_id"], lambda progress: fetch_blob(
            self.store, blob_id, r["manifest"], [SessionSource(session)], alias, r["kind"], progress))
        return {"have": have, "missing": missing}

    def pull(self, session: "LinkSession", request: dict[str, Any]) -> dict[str, Any]:
        r = validate(request, PULL)
        alias = self.tower.remote_alias(r["alias"], r["kind"])
        sources = r["sources"]
        if not 0 < len(sources) <= MAX_PULL_SOURCES or any(not isinstance(h, bytes) or len(h) != 16
                                                            for h in sources):
            raise WireError(Code.BAD_REQUEST, f"sources must list 1..{MAX_PULL_SOURCES} destination hashes (16 bytes)")
        self._start(session, r["xfer_id"], lambda progress: self._pull(r["name"], sources, alias, r["kind"], progress))
        return {}

    def _pull(self, name: str, sources: list[bytes], alias: str | None, kind: str,
              progress: Progress) -> tuple[BlobInfo | None, SyncReport]:
        connections = [self._peer(h) for h in sources if h != self.tower.destination.hash]
        reply = first_manifest(connections, name)
        blob_id = matching_blob_id(name, reply)
        # The reply's manifest is unchecked here: the store checks it against blob_id.
        return fetch_blob(self.store, blob_id, cast(bytes, reply.get("manifest")), [LinkSource(c) for c in connections],
                          alias, kind, progress)

    def _peer(self, destination_hash: bytes) -> TowerConnection:
        conn = self.peers.get(destination_hash)
        if conn is None:
            conn = self.peers[destination_hash] = TowerConnection(self.tower.identity, destination_hash,
                                                                  f"tower {destination_hash.hex()[:8]}")
        return conn

    def _start(self, session: "LinkSession", xfer_id: int, transfer: Transfer) -> None:
        threading.Thread(target=self._run, args=(session, xfer_id, transfer), name=f"rngrid-xfer-{xfer_id}",
                         daemon=True).start()

    def _run(self, session: "LinkSession", xfer_id: int, transfer: Transfer) -> None:
        last = [0.0]

        def progress(done: int, total: int) -> None:
            now = time.monotonic()
            if now - last[0] >= 1 / PROGRESS_HZ or done == total:
                last[0] = now
                session.router.send(TransferProgress(xfer_id, done, total))

        try:
            info, report = transfer(progress)
            # The tower's record of what a transfer moved: a resumed one names the chunks it kept.
            log.info("transfer %s: %s complete, %d chunk(s), %d already here", xfer_id,
                     cast(BlobInfo, info).hex[:16], report.chunks, report.reused)
            # A transfer runs after start() made the announcer; the blob it completed is in the store.
            cast(Announcer, self.tower.announcer).request("blob received")
            session.router.send(TransferEnd(xfer_id, True, "", f"have {cast(BlobInfo, info).hex[:16]}",
                                            report.to_map()))
        except WireError as e:
            log.warning("transfer %s failed: %s", xfer_id, e)
            session.router.send(TransferEnd(xfer_id, False, e.code, e.message, {}))
        except Exception as e:
            log.exception("transfer %s failed", xfer_id)
            session.router.send(TransferEnd(xfer_id, False, Code.INTERNAL, f"{type(e).__name__}: {e}", {}))
