"""What a would-be coordinator measures of its links to other towers: round trips, and rates seen.

A split model's cost per token is mostly its coordinator's round trips to
each worker (split/estimate.py), so a plan is made with the coordinator's own
view, not the client's: ``split/probe`` ``{"towers": [destination hash, ...]}``
-> ``{"rtts": {hex: seconds}, "rates": {hex: bytes/s}, "rpc_rtts": {hex: seconds},
"pending": [hex, ...], "refused": [hex, ...]}``. RTTs come from pings over a Link of this tower's
(identified with its identity), the best of PINGS; an answer is kept FRESH_S
seconds. A tower not measured yet is ``pending``: its pings run in the
background (an RNS request handler must return at once) and the caller asks
again. ``rates`` are what this tower saw crossing to a worker while it loaded
a split model there (bytes over seconds), where it did; ``rpc_rtts`` the
round trip of one llama.cpp RPC command to that worker's RPC server the way
the split's RPC bytes went (the data plane and its relays, or the RNS
tunnel), timed when the link was proven before that load (tower/split.py). A
ping crosses RNS, not that way, and the two stretch differently on a busy
machine; the RPC server serves one connection at a time, so only a load can
time its way, and the latest load's figure stands until the next.

Only towers this tower has heard announce as lenders (their caps carry
``lend_mib``: a split's possible workers) are probed, at most MAX_PROBING at
once, each over a Link closed after its pings: a caller holding ``infer``
cannot make the tower link to any destination it names, nor keep a Link (and
its threads) open per name. The others are ``refused``.
"""

import threading
import time
from collections.abc import Iterable

import RNS

from announce.announcer import tower_destination_hash
from announce.caps import CapsError, decode
from links.wire import WireError
from reticulum_grid.node.connection import TowerConnection

PINGS = 3
#: Towers measured at once (a plan has at most 8 parts; a caller asks for at most 16).
MAX_PROBING = 16
FRESH_S = 60.0
#: Seconds one ping may take.
PING_TIMEOUT_S = 10.0


class LinkProbe:
    """RTTs from this tower (``identity``) to others, measured on demand, cached."""

    def __init__(self, identity: RNS.Identity) -> None:
        self.identity = identity
        self.rates: dict[bytes, float] = {}  # destination hash -> bytes/s seen while loading a split model
        self.rpc_rtts: dict[bytes, float] = {}  # destination hash -> seconds of an RPC round trip at the last load
        self._rtts: dict[bytes, tuple[float, float]] = {}  # destination hash -> (monotonic time, seconds)
        self._busy: dict[bytes, TowerConnection | None] = {}  # being measured -> its connection, once made
        self._lock = threading.Lock()

    def ask(self, destinations: Iterable[bytes]) -> tuple[dict[bytes, float], list[bytes], list[bytes]]:
        """(rtts, pending, refused) for ``destinations`` (16-byte hashes): the
        fresh ones known, the ones whose pings were started now or run still,
        and those not heard as lenders (or beyond MAX_PROBING at once)."""
        now = time.monotonic()
        rtts: dict[bytes, float] = {}
        pending: list[bytes] = []
        refused: list[bytes] = []
        with self._lock:
            for key in destinations:
                known = self._rtts.get(key)
                if known is not None and now - known[0] < FRESH_S:
                    rtts[key] = known[1]
                elif key in self._busy:
                    pending.append(key)
                elif len(self._busy) < MAX_PROBING and heard_lender(key):
                    pending.append(key)
                    self._busy[key] = None
                    threading.Thread(target=self._measure, args=(key,), name="rngrid-probe", daemon=True).start()
                else:
                    refused.append(key)
        return rtts, pending, refused

    def _measure(self, key: bytes) -> None:
        conn = TowerConnection(self.identity, key, f"tower {key.hex()[:8]}")
        with self._lock:
            self._busy[key] = conn
        try:
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
            conn.close()
            with self._lock:
                self._busy.pop(key, None)

    def last_rtt(self, key: bytes) -> float | None:
        """The latest RTT measured to tower ``key`` (seconds), however old; None if never measured."""
        with self._lock:
            known = self._rtts.get(key)
        return known[1] if known else None

    def record_rate(self, key: bytes, moved_bytes: int, seconds: float) -> None:
        """What crossed to worker ``key`` while a split model loaded (bytes, seconds)."""
        if moved_bytes > 0 and seconds > 0:
            self.rates[key] = moved_bytes / seconds

    def record_rpc_rtt(self, key: bytes, seconds: float) -> None:
        """The round trip of an RPC command to worker ``key``'s RPC server, the way its split's bytes go (seconds)."""
        if seconds > 0:
            self.rpc_rtts[key] = seconds

    def close(self) -> None:
        """Close the Links of the pings still running."""
        with self._lock:
            running = [conn for conn in self._busy.values() if conn is not None]
        for conn in running:
            conn.close()


def heard_lender(key: bytes) -> bool:
    """Whether ``key`` is a tower this process heard announce caps with ``lend_mib``."""
    identity = RNS.Identity.recall(key)
    if identity is None or tower_destination_hash(identity) != key:
        return False
    try:
        return bool(decode(RNS.Identity.recall_app_data(key)).lend_mib)
    except CapsError:
        return False
