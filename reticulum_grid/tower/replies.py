"""Replies a tower keeps per Link so a resent command is not run twice.

On a lossy radio link an RNS request or its reply (single packets, never
resent by RNS) can be lost; the client then sends the same bytes again
(node/connection.py). For commands in ``links.commands.ANSWERED_ONCE`` the tower
answers such a repeat with the reply it gave the first time instead of
starting a second stream or job.
"""

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

#: Replies kept per Link (the newest), and for how long (seconds): a client
#: resends within its request timeout (30 s by default, minutes on LoRa).
MAX_REPLIES = 64
KEEP_S = 900.0


class ReplyCache:
    def __init__(self, max_replies: int = MAX_REPLIES, keep_s: float = KEEP_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._replies: OrderedDict[bytes, tuple[float, bytes]] = OrderedDict()  # key -> (time, reply bytes)
        self._max, self._keep_s, self._clock = max_replies, keep_s, clock
        self._lock = threading.Lock()

    @staticmethod
    def key(path: str, data: bytes | bytearray) -> bytes:
        """The cache key of request bytes ``data`` on command ``path``."""
        return hashlib.blake2b(path.encode() + b"\0" + data, digest_size=16).digest()

    def get(self, key: bytes) -> bytes | None:
        """The reply first given to this request, or None."""
        with self._lock:
            self._expire()
            hit = self._replies.get(key)
            return None if hit is None else hit[1]

    def put(self, key: bytes, reply: bytes) -> None:
        with self._lock:
            self._replies[key] = (self._clock(), reply)
            self._replies.move_to_end(key)
            while len(self._replies) > self._max:
                self._replies.popitem(last=False)

    def _expire(self) -> None:
        now = self._clock()
        while self._replies:
            _, (at, _) = next(iter(self._replies.items()))
            if now - at <= self._keep_s:
                break
            self._replies.popitem(last=False)
