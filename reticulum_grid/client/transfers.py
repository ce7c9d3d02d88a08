"""Blob transfers of the Grid client: pull, push, tower-to-tower pulls, sync before dispatch.

A mixin of ``Grid`` (client/grid.py): it uses the Grid's table, store and Links.
"""

import logging
import queue
import secrets
from typing import TYPE_CHECKING, Any, cast

from announce.table import TowerEntry

from links.channel import ChannelRouter, get_alive
from links.chunks import MAX_PULL_SOURCES, TransferEnd, TransferProgress
from links.stream import MAX_STREAM_ID
from links.wire import Code, WireError
from reticulum_grid.node.connection import TowerConnection
from reticulum_grid.store.blobstore import BlobInfo
from reticulum_grid.store.names import KINDS, is_blob_id_prefix
from reticulum_grid.store.sync import (
    MAX_TRANSFER_S,
    LinkSource,
    Progress,
    SyncReport,
    check_duration,
    fetch_blob,
    first_manifest,
    matching_blob_id,
    measured_bps,
)

if TYPE_CHECKING:
    from reticulum_grid.client.parts import GridParts as _Parts
else:
    _Parts = object  # the mixin's base for the type checker only (client/parts.py)

log = logging.getLogger("rngrid.client")
#: A tower-side transfer silent this long (no progress, no heartbeat) is lost
#: (seconds; on a slow link longer than the tower's own wait for our chunks).
TRANSFER_IDLE_S = 60.0


class BlobTransfers(_Parts):
    """Pull, push and sync methods of ``Grid``."""

    def holders(self, name: str, timeout: float = 10.0) -> list[TowerEntry]:
        """Live towers that hold blob ``name`` (alias or blob id hex), from their
        caps, else from their caps/full."""
        live = self.towers(wait=timeout) if not self.table.live() else self.table.live()
        found = [e for e in live if e.caps.model(name) is not None or e.caps.adapter(name)]
        if found:
            return found
        return [e for e, full in self.caps_full(live) if full.holds(name)]

    def pull(self, name: str, from_tower: str | None = None, alias: str | None = None,
             progress: Progress | None = None,
             max_seconds: float | None = MAX_TRANSFER_S) -> tuple[BlobInfo | None, SyncReport]:
        """Fetch blob ``name`` into this client's store from every tower that has
        it (or from ``from_tower``), in parallel. Returns (BlobInfo, SyncReport).
        Raises WireError(too_slow) when the links' measured rate says it would
        take longer than ``max_seconds`` (None: no limit)."""
        entries = [self.find_tower(from_tower)] if from_tower else self.holders(name)
        if not entries:
            raise WireError(Code.UNKNOWN_BLOB, f"no tower heard holds {name!r}")
        connections = [self.connection(e) for e in entries]
        reply = first_manifest(connections, name)
        blob_id = matching_blob_id(name, reply)
        if isinstance(reply.get("size"), int) and self.store.info(blob_id) is None:
            check_duration(reply["size"], measured_bps(connections), f"pull {name}", max_seconds)
        alias = alias or (None if is_blob_id_prefix(name) else name) or (reply.get("aliases") or [None])[0]
        kind = reply.get("kind") if reply.get("kind") in KINDS else "file"
        # The reply's manifest is unchecked here: the store checks it against blob_id.
        return fetch_blob(self.store, blob_id, cast(bytes, reply.get("manifest")),
                          [LinkSource(c) for c in connections], alias=alias, kind=kind, progress=progress)

    def push(self, name: str, to_tower: str | TowerEntry, alias: str | None = None,
             progress: Progress | None = None, max_seconds: float | None = MAX_TRANSFER_S) -> dict[str, Any]:
        """Send blob ``name`` from this client's store to a tower (needs the
        ``sync`` role there). Returns the tower's report map. Raises
        WireError(too_slow) as ``pull`` does."""
        entry = to_tower if not isinstance(to_tower, str) else self.find_tower(to_tower)
        blob_id = self.store.resolve(name)
        info = self.store.info(blob_id)
        if info is None:
            raise WireError(Code.UNKNOWN_BLOB, f"blob {name!r} is not complete in this client's store")
        conn = self.connection(entry)
        conn.ensure_link()
        check_duration(info.size, measured_bps([conn]), f"push {name}", max_seconds)
        conn.offer(blob_id, self.store.read_chunk)
        xfer_id = secrets.randbelow(MAX_STREAM_ID)
        events = conn.watch_transfer(xfer_id)
        conn.request("blobs/push", {"blob_id": blob_id, "manifest": self.store.manifest_bytes(blob_id),
                                    "alias": alias or (info.aliases[0] if info.aliases else None),
                                    "kind": info.kind, "xfer_id": xfer_id})
        return _await_transfer(conn, events, progress)

    def tower_pull(self, entry: TowerEntry, name: str, sources: list[TowerEntry], alias: str | None = None,
                   kind: str = "model", progress: Progress | None = None) -> dict[str, Any]:
        """Have tower ``entry`` fetch blob ``name`` from the ``sources`` towers
        directly. Returns the tower's report map."""
        conn = self.connection(entry)
        xfer_id = secrets.randbelow(MAX_STREAM_ID)
        events = conn.watch_transfer(xfer_id)
        conn.request("blobs/pull", {"name": name, "sources": [s.destination_hash for s in sources],
                                    "alias": alias, "kind": kind, "xfer_id": xfer_id})
        return _await_transfer(conn, events, progress)

    def sync_to(self, entry: TowerEntry, name: str, kind: str = "model",
                progress: Progress | None = None) -> TowerEntry:
        """Put blob ``name`` (a model or adapter) on tower ``entry``: from the towers
        that hold it (tower to tower), else, or when that fails, from this client's
        store. Returns the tower's refreshed table entry."""
        has = (lambda caps: caps.model(name)) if kind == "model" else (lambda caps: caps.adapter(name))
        sources = [e for e in self.table.live() if has(e.caps) and e.destination_hash != entry.destination_hash]
        # A request names a few: those that answered lately first, then the nearest.
        sources = sorted(sources, key=lambda e: (self.health.get(e.destination_hash).backed_off(),
                                                 e.hops))[:MAX_PULL_SOURCES]
        local = self.local_blob(name) is not None
        pulled = False
        if sources:
            try:
                self.tower_pull(entry, name, sources, alias=name, kind=kind, progress=progress)
                pulled = True
            except WireError as e:
                if not local:
                    raise
                log.info("tower-to-tower sync of %s failed (%s); sending it from this client", name, e)
        elif not local:
            code = Code.UNKNOWN_MODEL if kind == "model" else Code.UNKNOWN_ADAPTER
            raise WireError(code, f"neither a tower heard nor this client holds {kind} {name!r}")
        if not pulled:
            self.push(name, entry, alias=name, progress=progress)
        return self.ask_full(entry)[0]


def _await_transfer(conn: TowerConnection, events: "queue.Queue[Any]", progress: Progress | None) -> dict[str, Any]:
    """Follow a tower-side transfer to its TransferEnd. Raises WireError."""
    while True:
        idle_s = max(TRANSFER_IDLE_S, 3 * cast(ChannelRouter, conn.router).patience_s())  # up: watch_transfer's Link
        message = get_alive(events, conn.router, idle_s, "transfer progress")
        if message is None:
            raise WireError(Code.UNREACHABLE, "link to the tower closed during the transfer")
        if isinstance(message, TransferProgress):
            if progress:
                progress(message.done, message.total)
        elif isinstance(message, TransferEnd):
            if not message.ok:
                raise WireError(message.code, message.message)
            return message.report
