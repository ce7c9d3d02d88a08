"""Tower-to-tower connections on the data plane (a tailnet or LAN address), admitted by a challenge.

Two services cross towers outside RNS, because they move bulk bytes at the
speed of the link: torch.distributed's store (multi-tower training) and
llama.cpp's RPC (split models). Neither authenticates, so both listen on
127.0.0.1 only. What another tower reaches on a tower's data-plane address is
a ``Front``: on each new TCP connection it sends ``greeting`` and a fresh
32-byte nonce, and relays the connection to the local service only if the next
32 bytes are HMAC-SHA256(secret, greeting + nonce), within AUTH_TIMEOUT_S. A
connection that fails (wrong or missing answer, silence) is closed before a
byte of it reaches the service. The secret is fresh per job attempt or split
plan and travels only inside the towers' RNS Link (encrypted, both towers
identified and authorized there); on the data plane only HMACs of nonces
travel, and a recorded answer is useless for the next nonce. ``peers``, when
given, also limits who may try (their data-plane addresses).

The other tower runs a ``Forwarder``: a listener on 127.0.0.1 that answers the
challenge for connections from given local processes only (``owners``:
node/socket_owner.py asks the kernel whose socket the other end is) and relays bytes
both ways, so no other local user or process can use it. Relayed sockets set
TCP_NODELAY: RPC is request and reply, and Nagle's delay would be paid on
every token.

The data plane itself must be a private network: the tailnet or LAN gives
encryption, RNS gives identity and authorization.
"""

import hashlib
import hmac
import ipaddress
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable

from reticulum_grid.node.socket_owner import owned_by, plain_ip

NONCE_BYTES = 32
MAC_BYTES = 32
#: Seconds a new connection has to answer the challenge before it is dropped.
AUTH_TIMEOUT_S = 5.0
#: Largest relay read (bytes).
RELAY_BYTES = 1 << 16
#: TCP keepalive on a front's relayed connections: (idle s, interval s, probes). A peer
#: machine that vanished frees the local service within about 25 s, not the
#: kernel's default two hours; a peer process that died closes its socket at once.
KEEPALIVE = (10, 5, 3)


class DataPlaneError(RuntimeError):
    pass


def check_bind_address(host: str) -> str:
    """``host`` if it is one IP address a tower may listen on: never the wildcard.
    Raises DataPlaneError."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise DataPlaneError(f"data-plane address {host!r} is not an IP address") from None
    if address.is_unspecified:
        raise DataPlaneError(f"data-plane address {host} would listen on every interface; name one address")
    return host


def answer(secret: bytes, greeting: bytes, nonce: bytes) -> bytes:
    """The 32-byte answer to a challenge ``nonce`` after ``greeting``, for ``secret`` (bytes)."""
    return hmac.new(secret, greeting + nonce, hashlib.sha256).digest()


def free_port(host: str) -> int:
    """A TCP port on ``host`` that was free a moment ago."""
    with socket.socket(_family(host)) as s:
        s.bind((check_bind_address(host), 0))
        return s.getsockname()[1]


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def recv_exact(conn: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        part = conn.recv(size - len(data))
        if not part:
            return None
        data += part
    return data


def _relay(a: socket.socket, b: socket.socket, counter: "ByteCount | None" = None) -> None:
    """Copy bytes a -> b until either side closes; then close both."""
    try:
        while data := a.recv(RELAY_BYTES):
            b.sendall(data)
            if counter is not None:
                counter.add(len(data))
    except OSError:
        pass
    _shut(a, b)


def _keep_alive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in zip(("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT"), KEEPALIVE):
        if hasattr(socket, name):  # Linux; macOS has the first as TCP_KEEPALIVE
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _shut(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _serve(server: socket.socket, handle: Callable[[socket.socket], None], name: str) -> None:
    """Accept connections on ``server`` on a thread named ``name`` until it is
    closed, each handed to ``handle`` on a thread of its own."""
    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return  # closed
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, name=name, daemon=True).start()


class ByteCount:
    """Bytes relayed (thread-safe), for load progress and figures;
    ``last_active``: the time.monotonic() of the last, None before any."""

    def __init__(self) -> None:
        self.value = 0
        self.last_active: float | None = None
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n
            self.last_active = time.monotonic()


def splice(x: socket.socket, y: socket.socket, counter: ByteCount | None = None) -> None:
    """Relay ``x`` and ``y`` both ways, each on its own thread."""
    for sock in (x, y):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
    threading.Thread(target=_relay, args=(x, y, counter), daemon=True).start()
    threading.Thread(target=_relay, args=(y, x, counter), daemon=True).start()


class Front:
    """Listens on ``host:port`` (a data-plane address; port 0 picks one) and
    relays authenticated connections to the local service: ``target`` is its
    port on 127.0.0.1, or a function that returns a new connection to it (a
    service in a network of its own, node/private_net.py). ``peers``: the only
    data-plane addresses that may connect (None: any). ``admitted`` and
    ``refused`` count connections; ``moved`` the bytes relayed. ``close()``
    also ends the connections it relays."""

    def __init__(self, host: str, port: int, secret: bytes, target: int | Callable[[], socket.socket],
                 greeting: bytes, peers: Iterable[str] | None = None) -> None:
        self.secret, self.greeting = secret, greeting
        self.target = target if callable(target) else lambda: socket.create_connection(("127.0.0.1", target))
        self.peers = None if peers is None else {plain_ip(p) for p in peers}
        self.admitted = self.refused = 0
        self.moved = ByteCount()
        self.relayed: set[socket.socket] = set()
        self._closed = False
        self._sock = socket.create_server((check_bind_address(host), port), family=_family(host))
        self.port = self._sock.getsockname()[1]
        _serve(self._sock, self._admit, "rngrid-dataplane-front")

    def _admit(self, conn: socket.socket) -> None:
        try:
            if self.peers is not None and plain_ip(conn.getpeername()[0]) not in self.peers:
                raise PermissionError("not from a peer")
            conn.settimeout(AUTH_TIMEOUT_S)
            nonce = os.urandom(NONCE_BYTES)
            conn.sendall(self.greeting + nonce)
            got = recv_exact(conn, MAC_BYTES)
            if got is None or not hmac.compare_digest(got, answer(self.secret, self.greeting, nonce)):
                raise PermissionError("wrong or missing answer")
            conn.settimeout(None)
            target = self.target()
        except (OSError, PermissionError):
            self.refused += 1
            conn.close()
            return
        self.admitted += 1
        _keep_alive(conn)
        self.relayed.update((conn, target))
        if self._closed:  # closed while this one was admitted
            _shut(conn, target)
        splice(conn, target, self.moved)

    def close(self) -> None:
        self._closed = True
        self._sock.close()
        _shut(*list(self.relayed))


class Forwarder:
    """A listener on 127.0.0.1 (``port``) whose connections, from ``owners()``'s
    processes only, are carried to the front at ``host:port`` after answering
    its challenge; ``refused`` counts the others, ``moved`` the bytes relayed.
    The front may not be up yet: connecting is retried for ``timeout_s``."""

    def __init__(self, host: str, port: int, secret: bytes, greeting: bytes, owners: Callable[[], Iterable[int]],
                 timeout_s: float = 120.0) -> None:
        self.remote = (host, port)
        self.secret, self.greeting, self.owners = secret, greeting, owners
        self.timeout_s = timeout_s
        self.refused = 0
        self.moved = ByteCount()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.endpoint = f"127.0.0.1:{self.port}"
        _serve(self._sock, self._carry, "rngrid-dataplane-forwarder")

    def _carry(self, local: socket.socket) -> None:
        if not owned_by(local, self.owners()):
            self.refused += 1
            local.close()
            return
        remote = self._connect()
        if remote is None:
            local.close()
            return
        splice(local, remote, self.moved)

    def _connect(self) -> socket.socket | None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            try:
                remote = socket.create_connection(self.remote, timeout=AUTH_TIMEOUT_S)
                hello = recv_exact(remote, len(self.greeting) + NONCE_BYTES)
                if hello is None or not hello.startswith(self.greeting):
                    raise OSError("not a data-plane front")
                remote.sendall(answer(self.secret, self.greeting, hello[len(self.greeting):]))
                remote.settimeout(None)
                return remote
            except OSError:
                time.sleep(0.3)
        return None

    def close(self) -> None:
        self._sock.close()


def interface_of(address: str) -> str:
    """Name of the network interface that holds IP ``address`` (for gloo's and
    NCCL's socket settings, which take interface names). Raises DataPlaneError."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == address for a in addresses):
            return name
    raise DataPlaneError(f"no network interface here holds the data-plane address {address}")
