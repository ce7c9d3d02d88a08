"""A byte tunnel over an RNS Link: llama.cpp RPC between towers.

llama.cpp's RPC has no authentication and trusts every byte it reads, so its
servers listen on 127.0.0.1 only. The coordinator tower opens a Link to a
worker tower (identified, holding the ``shard`` role there) and listens on an
ephemeral 127.0.0.1 port; every TCP connection made to that port (by the
split model's RPC client) becomes one tunnel, which the worker tower joins
to a new connection to its own RPC server (split/rpcworker.py).

Its Channel messages (TunnelOpen, TunnelData, TunnelClose) are in links/tunnel.py.

Why not RNS.Buffer: on rns 0.9.4 it cuts every write to the static Link MDU
(~425 bytes) however large the negotiated MTU, and bz2-compresses each piece
up to three times; weights do not compress and a model load is tens of MB.
A tunnel whose Link goes away closes its sockets, so the RPC client sees the
peer vanish at once instead of waiting on a dead Link. rns 0.9.4 notices a
peer that vanished with its Link up only after the Link's 12-minute stale
time, and meanwhile the worker's RPC server (one connection at a time) would
stay held: so while a worker's tunnels are open it checks every KEEPALIVE_S
seconds that the Link's interface is still there and sends an empty
TunnelData (tunnel 0, which no tunnel uses); a peer that does not acknowledge
it makes the Channel give up after its retries and tear the Link down, which
closes the tunnels.

Who may use a tunnel: on the worker, only a Link from a tower holding
``shard`` there (tower/shard.py), and that tower can then drive the worker's
RPC server as llama.cpp's RPC lets any client (allocate buffers, read and
write them, run graphs: it trusts its client's input). On the coordinator, a
listener on 127.0.0.1 can be reached by every local user and process, so it
accepts only connections made by its own split model's process (or its
children), as the kernel tells (node/socket_owner.py); any other is closed before a
byte crosses the Link.
"""

import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable

from RNS.Channel import ChannelException

from links.channel import ChannelRouter
from links.tunnel import TunnelClose, TunnelData, TunnelOpen
from reticulum_grid.node.socket_owner import owned_by

log = logging.getLogger("rngrid.split.tunnel")

#: Bytes of TunnelData's own fields inside a Channel message.
DATA_OVERHEAD = 24
#: How often the coordinator end checks that its Link is still usable (seconds).
LINK_POLL_S = 0.5
#: Tunnels one Link may carry at once.
MAX_TUNNELS = 16
#: How often a worker with open tunnels asks the coordinator's tower to acknowledge (seconds, or 4 RTTs if longer).
KEEPALIVE_S = 5.0
#: A tunnel that closes after this many seconds without a byte logs its Channel's state.
QUIET_LOG_S = 20.0


class _Pipe:
    """One TCP socket joined to one tunnel id: a reader thread (socket to
    Channel) and a writer thread (Channel to socket, so RNS's thread never
    blocks on a socket), started by ``start()`` once ``Tunnels.pipes`` holds it."""

    def __init__(self, tunnels: "Tunnels", tunnel_id: int, sock: socket.socket) -> None:
        self.tunnels, self.tunnel_id, self.sock = tunnels, tunnel_id, sock
        self.outbox: queue.Queue[bytes | None] = queue.Queue()
        self.closed = threading.Event()

    def start(self) -> None:
        for target in (self._read, self._write):
            threading.Thread(target=target, name=f"rngrid-tunnel-{self.tunnel_id}", daemon=True).start()

    def _read(self) -> None:
        limit = self.tunnels.router.payload_limit(DATA_OVERHEAD)
        try:
            while not self.closed.is_set():
                data = self.sock.recv(limit)
                if not data:
                    break
                data += self._drain(limit - len(data))
                self.tunnels.sent_bytes += len(data)
                self.tunnels.last_active = time.monotonic()
                if not self.tunnels.router.send(TunnelData(self.tunnel_id, data)):
                    break
        except OSError:
            pass
        self.close("socket closed", tell_peer=True)

    def _drain(self, room: int) -> bytes:
        """What else the socket already holds (up to ``room`` bytes): RPC writes
        a command in several small pieces, and every Channel message costs a
        packet and a delivery proof."""
        more = b""
        self.sock.setblocking(False)
        try:
            while len(more) < room:
                chunk = self.sock.recv(room - len(more))
                if not chunk:
                    break
                more += chunk
        except (BlockingIOError, InterruptedError):
            pass
        finally:
            self.sock.setblocking(True)
        return more

    def _write(self) -> None:
        try:
            while True:
                data = self.outbox.get()
                if data is None:
                    break
                self.sock.sendall(data)
        except OSError:
            self.close("socket write failed", tell_peer=True)

    def close(self, reason: str, tell_peer: bool = False) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        log.info("tunnel %d closed: %s (%d bytes out, %d in on this link)", self.tunnel_id, reason,
                 self.tunnels.sent_bytes, self.tunnels.received_bytes)
        quiet_s = time.monotonic() - (self.tunnels.last_active or time.monotonic())
        if quiet_s >= QUIET_LOG_S:  # RPC is request and reply: a tunnel this quiet waited on a lost message
            log.warning("tunnel %d was quiet for %.0f s before it closed; channel: %s", self.tunnel_id, quiet_s,
                        self.tunnels.router.describe())
        self.outbox.put(None)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.tunnels.forget(self.tunnel_id)
        if tell_peer and self.tunnels.router.link_usable():
            self.tunnels.router.send(TunnelClose(self.tunnel_id, reason))


class Tunnels:
    """The tunnels of one Link (either end). ``target``: on a worker, makes the
    connection to the local RPC server that a TunnelOpen is joined to (None on
    the coordinator, which refuses TunnelOpen)."""

    def __init__(self, router: ChannelRouter, target: Callable[[], socket.socket] | None = None) -> None:
        self.router = router
        self.target = target
        self.pipes: dict[int, _Pipe] = {}
        self.sent_bytes = 0
        self.received_bytes = 0
        #: bytes that came for a tunnel not open here (closed, or never opened): a stall's evidence
        self.dropped_bytes = 0
        #: time.monotonic() of the last byte either way (None: none yet)
        self.last_active: float | None = None
        self._lock = threading.Lock()
        self._next_id = 1
        self._closed = threading.Event()
        router.on(TunnelOpen, self._open)
        router.on(TunnelData, self._data)
        router.on(TunnelClose, self._close)
        if target is not None:
            threading.Thread(target=self._keepalive, name="rngrid-tunnel-keepalive", daemon=True).start()

    def _keepalive(self) -> None:
        while not self._closed.wait(max(KEEPALIVE_S, 4 * (self.router.link.rtt or 0))):
            if not self.pipes:
                continue  # no server held
            if not self.router.link_usable():  # the interface it came in on is gone: nothing could be acknowledged
                log.info("the link of %d tunnel(s) lost its interface; tearing it down", len(self.pipes))
                self.router.link.teardown()
                return
            channel = self.router.channel
            if not channel.is_ready_to_send():
                continue  # bytes in flight already prove the peer alive, or exhaust the Channel's retries
            try:
                channel.send(TunnelData(0, b""))
            except ChannelException as e:  # a closing Link refuses it; the next round or close_all ends this thread
                log.debug("tunnel keepalive not sent: %s", e)

    def attach(self, sock: socket.socket) -> None:
        """Carry an accepted local socket over a new tunnel (coordinator end)."""
        with self._lock:
            tunnel_id, self._next_id = self._next_id, self._next_id + 1
        pipe = self._add(tunnel_id, sock)
        self.router.send(TunnelOpen(tunnel_id))
        pipe.start()

    def _add(self, tunnel_id: int, sock: socket.socket) -> _Pipe:
        """A pipe for ``tunnel_id``, known to ``_data`` and ``_close`` before its
        threads start: its reader sends what the socket already holds at once
        (llama.cpp's HELLO), and the peer's reply, handled on RNS's thread, was
        dropped when it came before the thread that started the reader had
        added the pipe (a split load then waited out its 60 s bound)."""
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # RPC is request/reply: no Nagle delay
        pipe = _Pipe(self, tunnel_id, sock)
        with self._lock:
            self.pipes[tunnel_id] = pipe
        return pipe

    def _open(self, message: TunnelOpen) -> None:
        if self.target is None or message.tunnel_id in self.pipes or len(self.pipes) >= MAX_TUNNELS:
            self.router.send(TunnelClose(message.tunnel_id, "refused"))
            return
        try:
            sock = self.target()
        except (OSError, RuntimeError) as e:  # RuntimeError: split/rpcworker.py's RpcUnavailable
            self.router.send(TunnelClose(message.tunnel_id, f"no RPC server: {e}"))
            return
        log.info("tunnel %d open to the RPC server", message.tunnel_id)
        self._add(message.tunnel_id, sock).start()

    def _data(self, message: TunnelData) -> None:
        pipe = self.pipes.get(message.tunnel_id)
        if pipe is not None:
            self.received_bytes += len(message.data)
            self.last_active = time.monotonic()
            pipe.outbox.put(message.data)
        elif message.tunnel_id != 0:  # 0: the worker's keepalive
            self.dropped_bytes += len(message.data)
            log.info("tunnel %d: %d bytes dropped, no such tunnel open here (%d dropped on this link)",
                     message.tunnel_id, len(message.data), self.dropped_bytes)

    def _close(self, message: TunnelClose) -> None:
        pipe = self.pipes.get(message.tunnel_id)
        if pipe is not None:
            log.info("tunnel %d closed by the peer: %s", message.tunnel_id, message.reason)
            pipe.close(message.reason)

    def forget(self, tunnel_id: int) -> None:
        with self._lock:
            self.pipes.pop(tunnel_id, None)

    def close_all(self, reason: str = "link closed") -> None:
        self._closed.set()
        for pipe in list(self.pipes.values()):
            pipe.close(reason)


class TunnelListener:
    """The coordinator end: a TCP server on 127.0.0.1 (ephemeral port) whose
    connections are tunnelled over ``tunnels``' Link. ``endpoint`` is what
    llama.cpp's RPC client is given. ``owners()`` -> process ids whose
    connections (theirs or their children's) are accepted; others are closed
    and counted in ``refused``."""

    def __init__(self, tunnels: Tunnels, owners: Callable[[], Iterable[int]]) -> None:
        self.tunnels = tunnels
        self.owners = owners
        self.refused = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.server.getsockname()[1]}"
        log.info("tunnel endpoint %s over a link with a %d-byte Channel MDU", self.endpoint, tunnels.router.channel.mdu)
        self._stopped = threading.Event()
        threading.Thread(target=self._accept, name="rngrid-tunnel-accept", daemon=True).start()
        threading.Thread(target=self._watch, name="rngrid-tunnel-watch", daemon=True).start()

    def _watch(self) -> None:
        # rns 0.9.4 keeps a Link whose peer vanished open for minutes; closing
        # the sockets at once makes the RPC client (in its own process) fail fast.
        while not self._stopped.wait(LINK_POLL_S):
            if not self.tunnels.router.link_usable():
                self.tunnels.close_all("the link to the worker tower is gone")
                return

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                sock, _ = self.server.accept()
            except OSError:
                return
            if self._stopped.is_set():
                sock.close()
                return
            if not owned_by(sock, self.owners()):
                self.refused += 1
                log.warning("tunnel endpoint %s: refused a connection not made by the split model", self.endpoint)
                sock.close()
                continue
            self.tunnels.attach(sock)

    def close(self) -> None:
        self._stopped.set()
        self.server.close()
        self.tunnels.close_all("coordinator closed the tunnel")
