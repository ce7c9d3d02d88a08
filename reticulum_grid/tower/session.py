"""A client's Link on a tower: its stream routes, chunk server and fetcher,
reply cache, the cancel events of its streams and the tunnels a coordinator
opens; the tower (``TowerParts``) hears when it closes."""

import logging
import threading
from collections.abc import Callable
from typing import Any

import RNS

from links import auth
from links.channel import ChannelRouter
from links.chunks import ChunkFetcher, ChunkServer
from links.stream import StreamRoutes
from links.wire import Code, WireError
from reticulum_grid.node.dataplane import Front
from reticulum_grid.split.tunnel import Tunnels
from reticulum_grid.tower.parts import TowerParts
from reticulum_grid.tower.replies import ReplyCache

log = logging.getLogger("rngrid.tower")


class LinkSession:
    """A client's Link: stream routes, chunk server and fetcher, and the cancel
    events of its streams."""

    def __init__(self, link: RNS.Link, tower: TowerParts) -> None:
        self.link = link
        self.streams: dict[int, threading.Event] = {}
        self.replies = ReplyCache()
        self.router = ChannelRouter(link)
        self.stream_routes = StreamRoutes(self.router, on_cancel=self.cancel)
        self.fetcher = ChunkFetcher(self.router)
        self.chunk_server = ChunkServer(self.router, tower.store.read_chunk, self._authorize_read)
        self.tunnels: Tunnels | None = None  # once a coordinator opens one (tower/shard.py)
        self.fronts: list[Front] = []  # the data-plane fronts a coordinator's plans opened here (tower/shard.py)
        self._tower = tower
        self._on_close: list[Callable[[], object]] = []
        link.set_link_closed_callback(self._closed)

    def on_close(self, callback: Callable[[], object]) -> None:
        """Run ``callback()`` when this Link closes."""
        self._on_close.append(callback)

    @property
    def identity(self) -> Any:  # the RNS.Identity the client identified as, or None
        return self.link.get_remote_identity()

    def _authorize_read(self, blob_id: bytes) -> None:
        auth.require(self.identity, "sync", self._tower.allow.roles_of)
        if not self._tower.store.has(blob_id):
            raise WireError(Code.UNKNOWN_BLOB, f"blob {blob_id.hex()[:16]} is not on this tower")

    def cancel(self, stream_id: int) -> None:
        event = self.streams.get(stream_id)
        if event is not None:
            log.info("stream %d: a cancel from the client", stream_id)
            event.set()

    def _closed(self, link: RNS.Link) -> None:
        if self.streams:
            log.info("link closed with %d stream(s) running: stopping them", len(self.streams))
        for event in list(self.streams.values()):
            event.set()
        self.fetcher.link_closed()
        for callback in self._on_close:
            callback()
        self._tower.link_closed(link)
