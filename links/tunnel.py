"""Channel messages of a byte tunnel over an RNS Link (reticulum_grid/split/tunnel.py
carries llama.cpp RPC between a coordinator and a shard in them).

Message types (msgpack arrays)::

    TunnelOpen  0x0401 [tunnel_id]
    TunnelData  0x0402 [tunnel_id, bytes]        # up to the Link's Channel MDU
    TunnelClose 0x0403 [tunnel_id, reason]
"""

import msgpack
import RNS

from links.channel import ProtocolError, short_str, uint, unpack_array


class TunnelOpen(RNS.MessageBase):
    MSGTYPE = 0x0401

    def __init__(self, tunnel_id: int = 0) -> None:
        self.tunnel_id = tunnel_id

    def pack(self) -> bytes:
        return msgpack.packb([self.tunnel_id])

    def unpack(self, raw: bytes) -> None:
        (tunnel_id,) = unpack_array(raw, 1)
        self.tunnel_id = uint(tunnel_id, "tunnel id")


class TunnelData(RNS.MessageBase):
    MSGTYPE = 0x0402

    def __init__(self, tunnel_id: int = 0, data: bytes = b"") -> None:
        self.tunnel_id, self.data = tunnel_id, data

    def pack(self) -> bytes:
        return msgpack.packb([self.tunnel_id, self.data], use_bin_type=True)

    def unpack(self, raw: bytes) -> None:
        tunnel_id, data = unpack_array(raw, 2)
        if not isinstance(data, bytes):
            raise ProtocolError("tunnel data is not bytes")
        self.tunnel_id, self.data = uint(tunnel_id, "tunnel id"), data


class TunnelClose(RNS.MessageBase):
    MSGTYPE = 0x0403

    def __init__(self, tunnel_id: int = 0, reason: str = "") -> None:
        self.tunnel_id, self.reason = tunnel_id, reason

    def pack(self) -> bytes:
        return msgpack.packb([self.tunnel_id, self.reason])

    def unpack(self, raw: bytes) -> None:
        tunnel_id, reason = unpack_array(raw, 2)
        self.tunnel_id, self.reason = uint(tunnel_id, "tunnel id"), short_str(reason, "reason", 200)
