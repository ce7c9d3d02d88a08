"""Channel messages of a byte tunnel over an RNS Link (reticulum_grid/split/tunnel.py
carries llama.cpp RPC between a coordinator and a shard in them).

Message types (msgpack arrays)::

    TunnelOpen  0x0401 [tunnel_id]
    TunnelData  0x0402 [tunnel_id, bytes]        # up to the Link's Channel MDU
    TunnelClose 0x0403 [tunnel_id, reason]
"""

from dataclasses import dataclass

from links.message import Message, bytes_field, text_field, uint_field


@dataclass
class _Tunnel(Message):
    """A tunnel message: the tunnel it belongs to comes first."""
    tunnel_id: int = uint_field("tunnel id")


@dataclass
class TunnelOpen(_Tunnel):
    MSGTYPE = 0x0401


@dataclass
class TunnelData(_Tunnel):
    MSGTYPE = 0x0402
    data: bytes = bytes_field("tunnel data")


@dataclass
class TunnelClose(_Tunnel):
    MSGTYPE = 0x0403
    reason: str = text_field("reason", 200)
