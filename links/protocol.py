"""The grid's protocol on a Link: its version, and every Channel message type once.

Version: every request map a client sends carries ``VERSION_FIELD`` (stamped
by node/connection.py, for towers that ask other towers too), and a tower
checks it before anything else (tower/daemon.py): a peer on another version
gets ``protocol_mismatch`` with both versions and which end to upgrade,
never a reply it would misread or messages it cannot decode. Raise VERSION
whenever a request, reply or Channel message changes shape (links/commands.py
lists the commands; announce/caps.py versions the caps on its own).

Channel messages: ``MESSAGE_TYPES`` lists every message class of the grid;
each family takes the numbers above its base in ``FAMILIES``
(tests/wire/test_protocol.py checks that no two share a MSGTYPE, that each sits in
its family and that each survives a round trip).
"""

from typing import Any

import RNS

from links.chunks import ChunkCancel, ChunkData, ChunkError, ChunkRequest, TransferEnd, TransferProgress
from links.jobevents import JobEvent
from links.stream import StreamCancel, StreamEnd, StreamError, TokenChunk
from links.tunnel import TunnelClose, TunnelData, TunnelOpen
from links.wire import Code, WireError

#: The protocol this package speaks.
VERSION = 1
#: The request map's key that carries it.
VERSION_FIELD = "v"
#: Base MSGTYPE of each family of Channel messages (a family owns base + 1 .. base + 0xFF).
FAMILIES = {"stream": 0x0100, "chunk": 0x0200, "job": 0x0300, "tunnel": 0x0400}
#: Every Channel message type, by family: token streams (links/stream.py), blob
#: chunks and transfers (links/chunks.py), job events (links/jobevents.py),
#: byte tunnels (links/tunnel.py).
MESSAGE_TYPES: dict[str, tuple[type[RNS.MessageBase], ...]] = {
    "stream": (TokenChunk, StreamEnd, StreamError, StreamCancel),
    "chunk": (ChunkRequest, ChunkData, ChunkError, ChunkCancel, TransferProgress, TransferEnd),
    "job": (JobEvent,),
    "tunnel": (TunnelOpen, TunnelData, TunnelClose),
}


def all_message_types() -> list[type[RNS.MessageBase]]:
    """Every Channel message class, in family order."""
    return [cls for family in MESSAGE_TYPES.values() for cls in family]


def stamp(payload: dict[str, Any], version: int = VERSION) -> dict[str, Any]:
    """``payload`` (a request map) with the protocol ``version`` it is sent in."""
    return {**payload, VERSION_FIELD: version}


def check(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` without its version field, once that says VERSION. Raises
    WireError(protocol_mismatch) naming both versions and the end to upgrade."""
    theirs = request.pop(VERSION_FIELD, None)
    if theirs == VERSION and type(theirs) is int:
        return request
    if not isinstance(theirs, int) or isinstance(theirs, bool):
        raise WireError(Code.PROTOCOL_MISMATCH,
                        f"this tower speaks rngrid protocol {VERSION} and the request names no protocol version "
                        f"(a client from before protocol {VERSION}): upgrade rngrid on the client")
    older = "the client" if theirs < VERSION else "this tower"
    raise WireError(Code.PROTOCOL_MISMATCH,
                    f"this tower speaks rngrid protocol {VERSION}, the client protocol {theirs}: upgrade rngrid on "
                    f"{older} (both ends must run the same protocol)")
