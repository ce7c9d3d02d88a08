"""What a would-be coordinator measures of its links to other towers: round trips, and rates seen.

A split model's cost per token is mostly its coordinator's round trips to
each worker (split/estimate.py), so a plan is made with the coordinator's own
view, not the client's: ``split/probe`` ``{"towers": [destination hash, ...]}``
-> ``{"rtts": {hex: seconds}, "rates": {hex: bytes/s}, "pending": [hex, ...]}``.
RTTs come from pings over this tower's Links (identified with its identity),
the best of PINGS; an answer is kept FRESH_S seconds. A tower not measured
yet is ``pending``: its pings run in the background (an RNS request handler
must return at once) and the caller asks again. ``rates`` are what this tower
saw crossing to a worker while it loaded a split model there (bytes over
seconds), where it did.
"""

import threading
import time
from collections.abc import Iterable

import RNS

from links.wire import WireError
from reticulum_grid.node.connection import TowerConnection

PINGS = 3
FRESH_S = 60.0
#: Seconds one ping may take.
PING_TIMEOUT_S = 10.0


class LinkProbe:
    """RTTs from this tower (``identity``) to others, measured on demand, cached."""

    def __init__(self, identity: RNS.Identity) -> None:
        self.identity = identity
        self.rates: dict[bytes, float] = {}  # destination hash -> bytes/s seen while loading a split model
        self._rtts: dict[bytes, tuple[float, float]] = {}  # destination hash -> (monotonic time, seconds)
        self._busy: set[bytes] = set()
        self._connections: dict[bytes, TowerConnection] = {}
        self._lock = threading.Lock()

    def ask(self, destinations: Iterable[bytes]) -> tuple[dict[bytes, float], list[bytes]]:
        """(rtts, pending) for ``destinations`` (16-byte hashes): the fresh ones
        known, and the ones whose pings were started now or run still."""
        now = time.monotonic()
        rtts: dict[bytes, float] = {}
        pending: list[bytes] = []
        with self._lock:
            for key in destinations:
                known = self._rtts.get(key)
                if known is not None and now - known[0] < FRESH_S:
                    rtts[key] = known[1]
                    continue
                pending.append(key)
                if key not in self._busy:
                    self._busy.add(key)
                    threading.Thread(target=self._measure, args=(key,), name="rngrid-probe", daemon=True).start()
        return rtts, pending

    def _measure(self, key: bytes) -> None:
        try:
            conn = self._connections.get(key)
            if conn is None:
                conn = self._connections[key] = TowerConnection(self.identity, key, f"tower {key.hex()[:8]}")
            best = float("inf")
            for _ in range(PINGS):
                sent = time.monotonic()
                conn.request("ping", {}, PING_TIMEOUT_S, link_timeout=PING_TIMEOUT_S)
                best = min(best, time.monotonic() - sent)
            with self._lock:
                self._rtts[key] = (time.monotonic(), best)
        except WireError:
            pass  # not reachable from here: it stays unmeasured, and the plan leaves it out
        finally:
            with self._lock:
                self._busy.discard(key)

    def record_rate(self, key: bytes, moved_bytes: int, seconds: float) -> None:
        """What crossed to worker ``key`` while a split model loaded (bytes, seconds)."""
        if moved_bytes > 0 and seconds > 0:
            self.rates[key] = moved_bytes / seconds

    def close(self) -> None:
        for conn in self._connections.values():
            conn.close()
