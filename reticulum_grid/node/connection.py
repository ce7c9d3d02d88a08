"""One reusable, identified Link to one tower, used by clients and by towers
that fetch blobs from other towers.

Over it run commands (RNS requests), token streams and chunk transfers in
both directions; everything a caller waits on is bounded and ends with a
WireError when the Link closes.
"""

import logging
import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import RNS

from announce.announcer import APP_NAME, TOWER_ASPECT
from links import protocol, wire
from links.commands import RESENDABLE
from links.channel import MAX_ID, ChannelRouter, get_alive
from links.chunks import ChunkFetcher, ChunkServer, TransferEnd, TransferProgress
from links.jobevents import JobEvent
from links.manifest import Manifest
from links.stream import StreamCancel, StreamReceiver, StreamRoutes
from links.wire import Code, WireError

log = logging.getLogger("rngrid.client")


def wait_until(predicate: Callable[[], object], timeout: float, poll_s: float = 0.05) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


#: Shortest bound on one small round trip with a tower (link set-up, a ping,
#: a reply it sends at once), seconds: well above loopback and LAN jitter and a
#: busy tower's scheduling delays, far below the 15 s a silent tower once cost.
ATTEMPT_FLOOR_S = 3.0
#: A tower whose RTT was measured gets this many RTTs before it counts as silent.
RTT_FACTOR = 10
#: Round trips (at least RESEND_MIN_S seconds) a resendable command waits before it is sent again.
RESEND_RTTS = 6
RESEND_MIN_S = 3.0
#: Bytes RNS adds around a request's data (timestamp, path hash, msgpack
#: framing; rns 0.9.4 Link.request): more than the Link's MDU goes as a Resource.
REQUEST_FRAMING = 64
#: Full-size packets a round trip may need per hop, for the bound on a slow
#: interface before any RTT was measured (a LoRa radio carries one 500-byte
#: packet in ~3 s): a first contact sets up the Link (request, proof, RTT
#: packet, identify) before the request and its answer, on half-duplex air
#: that an announce may hold meanwhile.
PACKETS_PER_HOP = 8


def attempt_timeout(destination_hash: bytes, rtt_s: float = 0.0) -> float:
    """Seconds to wait for one small round trip with ``destination_hash``: the
    longest of ATTEMPT_FLOOR_S, RTT_FACTOR x ``rtt_s`` (the measured RTT, 0 if
    none) and the airtime of PACKETS_PER_HOP full packets per hop at the bitrate
    of the path's first interface (what RNS knows of a slow link before any RTT)."""
    slow_link_s = 0.0
    if RNS.Transport.has_path(destination_hash):
        per_byte_s = RNS.Transport.next_hop_per_byte_latency(destination_hash) or 0.0
        hops = max(1, RNS.Transport.hops_to(destination_hash))
        slow_link_s = PACKETS_PER_HOP * RNS.Reticulum.MTU * per_byte_s * hops
    return max(ATTEMPT_FLOOR_S, RTT_FACTOR * rtt_s, slow_link_s)


def open_link(destination_hash: bytes, app_name: str, *aspects: str, name: str | None = None, timeout: float = 15.0,
              closed_callback: Callable[[RNS.Link], None] | None = None) -> RNS.Link:
    """An established RNS Link to ``destination_hash`` (app and aspects as the
    destination announced them), requesting a path first when there is none.
    Raises WireError(unreachable) after ``timeout`` seconds per step."""
    name = name or destination_hash.hex()[:16]
    if not RNS.Transport.has_path(destination_hash):
        RNS.Transport.request_path(destination_hash)
        if not wait_until(lambda: RNS.Transport.has_path(destination_hash), timeout):
            raise WireError(Code.UNREACHABLE, f"no path to {name} within {timeout:.0f} s")
    destination = RNS.Destination(RNS.Identity.recall(destination_hash), RNS.Destination.OUT,
                                  RNS.Destination.SINGLE, app_name, *aspects)
    established = threading.Event()
    link = RNS.Link(destination, established_callback=lambda _: established.set(), closed_callback=closed_callback)
    if not established.wait(timeout):
        link.teardown()
        # The path may be stale (the peer moved or restarted): drop it so the
        # next try asks the network again instead of reusing it.
        RNS.Transport.expire_path(destination_hash)
        raise WireError(Code.UNREACHABLE, f"no link to {name} within {timeout:.0f} s")
    return link


class TowerConnection:
    """A Link to the tower at ``destination_hash``, identified as ``identity``."""

    #: The protocol version its requests carry (links/protocol.py).
    protocol_version: int = protocol.VERSION

    def __init__(self, identity: RNS.Identity, destination_hash: bytes, name: str) -> None:
        self.identity = identity
        self.destination_hash = destination_hash
        self.name = name
        self.link: RNS.Link | None = None
        self.router: ChannelRouter | None = None
        self.streams: StreamRoutes | None = None
        self.fetcher: ChunkFetcher | None = None
        self.receivers: dict[int, StreamReceiver] = {}
        self.transfers: dict[int, queue.Queue[Any]] = {}
        self.offered: dict[bytes, Callable[[bytes, int], bytes]] = {}
        self._lock = threading.Lock()

    def ensure_link(self, timeout: float = 15.0) -> RNS.Link:
        """The active Link, establishing it (and a path) if needed. Raises WireError(unreachable)."""
        with self._lock:
            if self.link is not None and self.link.status == RNS.Link.ACTIVE:
                if self.router is not None and self.router.link_usable():
                    return self.link
                self.link.teardown()  # its interface is gone: the tower went away
            link = open_link(self.destination_hash, APP_NAME, TOWER_ASPECT, name=f"tower {self.name}",
                             timeout=timeout, closed_callback=self._closed)
            link.identify(self.identity)
            router = ChannelRouter(link)
            self.link, self.router = link, router
            self.streams = StreamRoutes(router)
            self.fetcher = ChunkFetcher(router)
            router.on(TransferProgress, self._transfer_message)
            router.on(TransferEnd, self._transfer_message)
            router.on(JobEvent, lambda m: self._queue_for(m.watch_id, m.event))
            # Registered now so a tower's chunk request is always understood (and
            # refused unless offered): an unknown message type would break the Channel.
            ChunkServer(router, self._read_offered, self._authorize_offered)
            return link

    def request(self, path: str, payload: dict[str, Any], timeout: float = 30.0,
                link_timeout: float = 15.0) -> dict[str, Any]:
        """Send one command and wait for its reply map (``timeout`` seconds, and
        ``link_timeout`` to set up a Link first). Raises WireError.

        An RNS request and its reply are single packets that nothing resends, so
        on a lossy radio link a command in commands.RESENDABLE (those that change
        nothing on the tower, and those it answers once) is sent again (the same
        bytes, on the same Link) after RESEND_RTTS round trips without a reply,
        and a reply to any copy counts. A request too big for one packet travels
        as an RNS Resource, which resends its own parts: it is sent once. A
        request refused as unidentified is sent again after identifying again.
        Every request carries this end's protocol version (links/protocol.py):
        a tower on another one answers protocol_mismatch."""
        deadline, identified = time.monotonic() + timeout, False
        data = wire.pack(protocol.stamp(payload, self.protocol_version))
        while True:
            try:
                return self._exchange(path, data, deadline, link_timeout, timeout)
            except WireError as e:
                if e.code != Code.NOT_ALLOWED or "not identified" not in e.message or identified or self.link is None:
                    raise
            # identify() is one unacknowledged packet: a lossy radio link can lose it.
            self.link.identify(self.identity)
            identified = True

    def _exchange(self, path: str, data: bytes, deadline: float, link_timeout: float,
                  timeout: float) -> dict[str, Any]:
        replied = threading.Event()
        box: dict[str, bytes] = {}

        def on_response(receipt: RNS.RequestReceipt) -> None:
            box.setdefault("data", receipt.response)
            replied.set()

        link = self._send(path, data, on_response, replied.set, deadline, link_timeout)
        while True:
            wait = deadline - time.monotonic()
            if path in RESENDABLE and link.rtt and len(data) + REQUEST_FRAMING <= link.mdu:
                wait = min(wait, max(RESEND_MIN_S, RESEND_RTTS * link.rtt))
            replied.wait(max(0.0, wait))
            replied.clear()
            if "data" in box:
                return wire.parse_response(box["data"])
            if link.status != RNS.Link.ACTIVE:
                raise WireError(Code.UNREACHABLE, f"the link to {self.name} closed before it answered {path}")
            if time.monotonic() >= deadline:
                # A tower answers at once; silence means this Link is dead (e.g. the
                # tower restarted behind a transport node). The next request builds a new one.
                link.teardown()
                raise WireError(Code.TIMEOUT, f"{self.name} did not answer {path} within {timeout:.0f} s")
            # Only on this Link: a tower answers a repeat once per Link (tower/replies.py).
            log.info("no reply to %s from %s yet; sending it again", path, self.name)
            link.request(path, data, response_callback=on_response, failed_callback=lambda _: replied.set(),
                         timeout=max(0.1, deadline - time.monotonic()))

    def _send(self, path: str, data: bytes, on_response: Callable[[RNS.RequestReceipt], None],
              on_failed: Callable[[], None], deadline: float, link_timeout: float) -> RNS.Link:
        """The Link ``data`` went out on (a Link that cannot send any more is replaced once)."""
        for _ in range(2):
            link = self.ensure_link(link_timeout)
            receipt = link.request(path, data, response_callback=on_response, failed_callback=lambda _: on_failed(),
                                   timeout=max(0.1, deadline - time.monotonic()))
            if receipt:
                return link
            link.teardown()
        raise WireError(Code.UNREACHABLE, f"could not send {path} to {self.name}")

    # -- token streams ----------------------------------------------------
    def open_stream(self, stream_id: int, link_timeout: float = 15.0) -> StreamReceiver:
        self.ensure_link(link_timeout)
        receiver = self.receivers[stream_id] = StreamReceiver(stream_id)
        assert self.streams is not None  # set with the Link
        self.streams.add(stream_id, receiver.deliver)
        return receiver

    def close_stream(self, stream_id: int) -> None:
        self.receivers.pop(stream_id, None)
        if self.streams is not None:
            self.streams.remove(stream_id)

    def cancel(self, stream_id: int) -> None:
        """Stop a stream on the tower; a thread reading it (e.g. an HTTP gateway's
        worker, cancelled from another thread) gets WireError(cancelled) at once."""
        if self.router is not None and self.link is not None and self.link.status == RNS.Link.ACTIVE:
            self.router.send(StreamCancel(stream_id))
        receiver = self.receivers.get(stream_id)
        self.close_stream(stream_id)
        if receiver is not None:
            receiver.abort(Code.CANCELLED, "cancelled by this client")

    # -- blobs ------------------------------------------------------------
    def fetch(self, blob_id: bytes, manifest: Manifest, indices: list[int]) -> Iterator[tuple[int, bytes]]:
        """Chunks from this tower (see ChunkFetcher.fetch)."""
        self.ensure_link()
        assert self.fetcher is not None  # set with the Link
        return self.fetcher.fetch(blob_id, manifest, indices)

    def offer(self, blob_id: bytes, read_chunk: Callable[[bytes, int], bytes]) -> None:
        """Let the tower fetch ``blob_id`` from us over this Link (a push). Only
        offered blobs are served, through ``read_chunk(blob_id, index)``."""
        self.ensure_link()
        self.offered[blob_id] = read_chunk

    def _authorize_offered(self, blob_id: bytes) -> None:
        if blob_id not in self.offered:
            raise WireError(Code.NOT_ALLOWED, "that blob was not offered on this link")

    def _read_offered(self, blob_id: bytes, index: int) -> bytes:
        self._authorize_offered(blob_id)
        return self.offered[blob_id](blob_id, index)

    def watch_transfer(self, xfer_id: int) -> queue.Queue[Any]:
        """A queue that receives this transfer's TransferProgress and TransferEnd
        messages, or a job watch's events (None when the Link closes)."""
        q: queue.Queue[Any] = queue.Queue()
        self.transfers[xfer_id] = q
        return q

    def _transfer_message(self, message: TransferProgress | TransferEnd) -> None:
        self._queue_for(message.xfer_id, message)

    def _queue_for(self, key: int, item: object) -> None:
        q = self.transfers.get(key)
        if q is not None:
            q.put(item)

    def watch_job(self, job_id: str, idle_timeout: float = 600.0) -> Iterator[dict[str, Any]]:
        """Events of a training job (maps, see links/jobevents.py) until its "end" event."""
        self.ensure_link()
        watch_id = secrets.randbelow(MAX_ID)
        events = self.watch_transfer(watch_id)
        try:
            self.request("jobs/watch", {"job_id": job_id, "watch_id": watch_id})
            while True:
                event = get_alive(events, self.router, idle_timeout, "job events")
                if event is None:
                    raise WireError(Code.UNREACHABLE, f"link to tower {self.name} closed")
                yield event
                if event.get("type") == "end":
                    return
        finally:
            self.transfers.pop(watch_id, None)

    def close(self) -> None:
        if self.link is not None:
            self.link.teardown()

    def _closed(self, link: RNS.Link) -> None:
        for receiver in list(self.receivers.values()):
            receiver.abort(Code.UNREACHABLE, f"link to tower {self.name} closed")
        if self.fetcher is not None:
            self.fetcher.link_closed()
        for q in list(self.transfers.values()):
            q.put(None)
