"""Rendezvous of a multi-tower job: an authenticating front for torch's TCPStore
(the data plane's Front and Forwarder, node/dataplane.py, with the store's greeting).

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
(the store client inside it; node/socket_owner.py asks the kernel whose socket the
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

import os
from collections.abc import Iterable

from reticulum_grid.node import dataplane
from reticulum_grid.node.dataplane import AUTH_TIMEOUT_S, MAC_BYTES, NONCE_BYTES, interface_of  # noqa: F401

GREETING = b"rngrid-store/1 "
RendezvousError = dataplane.DataPlaneError
check_bind_address = dataplane.check_bind_address
free_port = dataplane.free_port


def answer(secret: bytes, nonce: bytes) -> bytes:
    """The 32-byte answer to a challenge ``nonce`` for job secret ``secret`` (bytes)."""
    return dataplane.answer(secret, GREETING, nonce)


class Front(dataplane.Front):
    """Listens on ``host:port`` (a data-plane address) and relays authenticated
    connections from ``peers`` (the other ranks' data-plane addresses) to the
    store at 127.0.0.1:``store_port``. ``admitted`` and ``refused`` count
    connections."""

    def __init__(self, host: str, port: int, secret: bytes, store_port: int, peers: Iterable[str] = ()) -> None:
        super().__init__(host, port, secret, store_port, GREETING, peers=peers)


class Forwarder(dataplane.Forwarder):
    """A listener on 127.0.0.1 (``port``) whose connections, from this process
    only (the worker's store client), are carried to the front at
    ``host:port`` after answering its challenge; ``refused`` counts the others.
    The front may not be up yet (rank 0 still loading): connecting is retried
    for ``timeout_s``."""

    def __init__(self, host: str, port: int, secret: bytes, timeout_s: float = 120.0) -> None:
        super().__init__(host, port, secret, GREETING, lambda: [os.getpid()], timeout_s)
