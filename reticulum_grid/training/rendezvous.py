"""Rendezvous of a multi-tower job: an authenticating front for torch's TCPStore.

torch.distributed's ``TCPStore`` has no authentication: whoever reaches its port
can read and write keys and so join (or break) the job's process group. Here the
store itself listens on 127.0.0.1 only, inside rank 0's worker. What the other
towers reach, on rank 0's data-plane address, is a ``Front``: on each new TCP
connection it sends a fresh 32-byte nonce and admits the connection only if the
next 32 bytes are HMAC-SHA256(job secret, greeting + nonce), within
``AUTH_TIMEOUT_S``. A connection that fails (wrong or missing answer, or
silence) is closed before a single byte of it reaches the store, so it can set
no key and join nothing. The secret is fresh per job attempt and reaches the
participants only inside their RNS Links; on the data plane only HMACs of
nonces travel (a recorded answer is useless for the next nonce).

The front also admits connections only from the job's peers' data-plane
addresses (``peers``: each participant names its own in its ``train/join``
check reply), so a machine that is not in the job is refused before any
challenge, whatever it knows.

Each participant runs the other half, a ``Forwarder``: a listener on 127.0.0.1
that answers the challenge for connections from its own worker process only
(the store client inside it; node/peers.py asks the kernel whose socket the
other end is) and then relays bytes both ways: another local user or process
that reaches the port is refused. Both close with the worker process, so the
job's ports live only as long as the job.

What this does not cover: the gloo/NCCL pair sockets that carry the tensors
have no authentication of their own and torch gives no way to filter who
connects to them. They learn their peers' ports only through this store and
bind to the data-plane interface, never 0.0.0.0, for the job's life; the data
plane itself must be a private network (a tailnet or a LAN), which the tower
config enforces (no public address).
"""

import hashlib
import hmac
import ipaddress
import os
import socket
import threading
import time

from reticulum_grid.node.peers import owned_by, plain_ip

GREETING = b"rngrid-store/1 "
NONCE_BYTES = 32
MAC_BYTES = 32
#: Seconds a new connection has to answer the challenge before it is dropped.
AUTH_TIMEOUT_S = 5.0
#: Largest relay read (bytes).
RELAY_BYTES = 1 << 16


class RendezvousError(RuntimeError):
    pass


def check_bind_address(host):
    """``host`` if it is one IP address a job may listen on: never the wildcard."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise RendezvousError(f"data-plane address {host!r} is not an IP address") from None
    if address.is_unspecified:
        raise RendezvousError(f"data-plane address {host} would listen on every interface; name one address")
    return host


def answer(secret, nonce):
    """The 32-byte answer to a challenge ``nonce`` for job secret ``secret`` (bytes)."""
    return hmac.new(secret, GREETING + nonce, hashlib.sha256).digest()


def free_port(host):
    """A TCP port on ``host`` that was free a moment ago."""
    with socket.socket(_family(host)) as s:
        s.bind((check_bind_address(host), 0))
        return s.getsockname()[1]


def _family(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _recv_exact(conn, size):
    data = b""
    while len(data) < size:
        part = conn.recv(size - len(data))
        if not part:
            return None
        data += part
    return data


def _relay(a, b):
    """Copy bytes a -> b until either side closes; then close both."""
    try:
        while data := a.recv(RELAY_BYTES):
            b.sendall(data)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _splice(x, y):
    threading.Thread(target=_relay, args=(x, y), daemon=True).start()
    threading.Thread(target=_relay, args=(y, x), daemon=True).start()


class Front:
    """Listens on ``host:port`` (a data-plane address) and relays authenticated
    connections from ``peers`` (the other ranks' data-plane addresses) to the
    store at 127.0.0.1:``store_port``. ``admitted`` and ``refused`` count
    connections."""

    def __init__(self, host, port, secret, store_port, peers=()):
        self.secret = secret
        self.store_port = store_port
        self.peers = {plain_ip(p) for p in peers}
        self.admitted = self.refused = 0
        self._sock = socket.create_server((check_bind_address(host), port), family=_family(host))
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, name="rngrid-store-front", daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._admit, args=(conn,), daemon=True).start()

    def _admit(self, conn):
        try:
            if plain_ip(conn.getpeername()[0]) not in self.peers:
                raise PermissionError("not from a peer of the job")
            conn.settimeout(AUTH_TIMEOUT_S)
            nonce = os.urandom(NONCE_BYTES)
            conn.sendall(GREETING + nonce)
            got = _recv_exact(conn, MAC_BYTES)
            if got is None or not hmac.compare_digest(got, answer(self.secret, nonce)):
                raise PermissionError("wrong or missing answer")
            conn.settimeout(None)
            store = socket.create_connection(("127.0.0.1", self.store_port))
        except (OSError, PermissionError):
            self.refused += 1
            conn.close()
            return
        self.admitted += 1
        _splice(conn, store)

    def close(self):
        self._sock.close()


class Forwarder:
    """A listener on 127.0.0.1 (``port``) whose connections, from this process
    only (the worker's store client), are carried to the front at
    ``host:port`` after answering its challenge; ``refused`` counts the others.
    The front may not be up yet (rank 0 still loading): connecting is retried
    for ``timeout_s``."""

    def __init__(self, host, port, secret, timeout_s=120.0):
        self.remote = (host, port)
        self.secret = secret
        self.timeout_s = timeout_s
        self.refused = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, name="rngrid-store-forwarder", daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._carry, args=(conn,), daemon=True).start()

    def _carry(self, local):
        if not owned_by(local, [os.getpid()]):
            self.refused += 1
            local.close()
            return
        remote = self._connect()
        if remote is None:
            local.close()
            return
        _splice(local, remote)

    def _connect(self):
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            try:
                remote = socket.create_connection(self.remote, timeout=AUTH_TIMEOUT_S)
                hello = _recv_exact(remote, len(GREETING) + NONCE_BYTES)
                if hello is None or not hello.startswith(GREETING):
                    raise OSError("not a job store front")
                remote.sendall(answer(self.secret, hello[len(GREETING):]))
                remote.settimeout(None)
                return remote
            except OSError:
                time.sleep(0.3)
        return None

    def close(self):
        self._sock.close()


def interface_of(address):
    """Name of the network interface that holds IP ``address`` (for gloo's and
    NCCL's socket settings, which take interface names). Raises RendezvousError."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == address for a in addresses):
            return name
    raise RendezvousError(f"no network interface here holds the data-plane address {address}")
