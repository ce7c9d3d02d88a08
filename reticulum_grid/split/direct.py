"""llama.cpp RPC between towers straight over their data-plane addresses.

Where both towers name a data-plane address (``[network] dataplane``: a
tailnet or LAN IP), the RPC bytes of a split model skip RNS: the worker opens
a Front (node/dataplane.py) on its address for this plan, admitting only the
coordinator's address and only after HMAC-SHA256 of a fresh nonce under a
32-byte secret made for this plan, and relays to its ggml-rpc-server
(split/rpcworker.py gives each connection); the coordinator runs a Forwarder on 127.0.0.1 that only its split
runner may use. The secret and both addresses cross inside the RNS Link of
``shard/tunnel`` (encrypted, both towers identified, the coordinator holding
``shard`` on the worker); where either tower has no data-plane address, the
RNS tunnel (tunnel.py) carries the bytes instead.

``shard/tunnel`` ``{"dataplane": coordinator's address}`` (optional) ->
``{"tower": name, "dataplane": {"host", "port", "secret": 32 bytes}}`` (only
when this tower has a data-plane address and was given one).
"""

import ipaddress
import secrets
import socket
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from links.wire import Code, WireError
from reticulum_grid.node.dataplane import Forwarder, Front

if TYPE_CHECKING:
    from reticulum_grid.split.tunnel import TunnelListener

#: What an RPC front says first (node/dataplane.py's challenge).
GREETING = b"rngrid-rpc/1 "
SECRET_BYTES = 32


def offer(own_address: str, coordinator_address: str,
          connect: Callable[[], socket.socket]) -> tuple[Front, dict[str, Any]]:
    """(Front, its reply map) for a coordinator at ``coordinator_address``, on
    this tower's ``own_address``, relaying to the RPC server connections
    ``connect()`` makes. Raises WireError(bad_request) for an address that is no IP."""
    try:
        peer = str(ipaddress.ip_address(coordinator_address))
    except ValueError:
        raise WireError(Code.BAD_REQUEST, "shard/tunnel's dataplane must be an IP address") from None
    secret = secrets.token_bytes(SECRET_BYTES)
    front = Front(own_address, 0, secret, connect, GREETING, peers=[peer])
    return front, {"host": own_address, "port": front.port, "secret": secret}


def forwarder(reply: dict[str, Any], owners: Callable[[], Iterable[int]]) -> Forwarder | None:
    """A Forwarder to the front a worker's ``shard/tunnel`` reply names, for
    ``owners()``'s processes; None when the reply names none. Raises
    WireError(bad_request) for a reply that does not hold together."""
    direct = reply.get("dataplane")
    if direct is None:
        return None
    try:
        host = str(ipaddress.ip_address(direct["host"]))
        port, secret = direct["port"], direct["secret"]
    except (TypeError, KeyError, ValueError):
        raise WireError(Code.BAD_REQUEST, "the worker's data-plane offer is malformed") from None
    if not isinstance(port, int) or not 0 < port < 65536 or not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
        raise WireError(Code.BAD_REQUEST, "the worker's data-plane offer is malformed")
    return Forwarder(host, port, secret, GREETING, owners, timeout_s=15.0)


def moved(listener: "Forwarder | TunnelListener") -> int:
    """Bytes a tunnel listener or a forwarder carried so far."""
    if isinstance(listener, Forwarder):
        return listener.moved.value
    return listener.tunnels.sent_bytes + listener.tunnels.received_bytes
