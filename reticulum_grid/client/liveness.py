"""Which towers answer, and how fast: probes, silent and dead towers, looking again.

A probe is a ``ping`` (an empty reply: its round trip is the RTT, whatever the
tower holds) and then ``caps/full`` (the live load; its size-dependent time
stays out of the RTT). Every attempt is bounded by connection.attempt_timeout,
and a tower that does not answer while others do ranks last within about a
second. A tower that did not answer, or could not be reached, is backed off;
DROP_AFTER_LOST such silences in a row take it out of the table until it
announces again. Each silence also makes the client ask the network again (a
discovery ping: towers announce, so a transport node that restarted and lost
its paths learns them anew; in the default interface mode it does not look
up paths it does not know).
"""

import logging
import queue
import threading
import time
from collections.abc import Mapping

import RNS

from announce.announcer import remembered_towers
from announce.capsfull import CapsError
from announce.table import TowerEntry
from links.wire import LINK_LOST, WireError
from reticulum_grid.client import router
from reticulum_grid.client.parts import GridParts
from reticulum_grid.node.connection import attempt_timeout


log = logging.getLogger("rngrid.client")

#: Once one tower answered a refresh, the others get this long (or
#: SILENT_FACTOR x that first answer's time) before they rank as silent.
SILENT_AFTER_S = 1.0
SILENT_FACTOR = 4
#: caps/full may be large (every blob a tower holds): its own bound (seconds).
FULL_TIMEOUT_S = 10.0
#: ... or this many of the ping's round trips, if longer (a slow radio link).
FULL_RTTS = 10
#: A probe's answer stays fresh for at least this many of the tower's round
#: trips (radio: ~0.8 s RTT on 5.5 kbit/s, so ~25 s; loopback and LANs: the caller's max age).
FRESH_RTTS = 30
#: A tower silent this many times in a row leaves the table.
DROP_AFTER_LOST = 2


class Liveness:
    """Probes and failure records for one Grid (its table, health book and Links)."""

    def __init__(self, grid: GridParts) -> None:
        self.grid = grid
        self._live_at: dict[bytes, float] = {}  # destination hash -> monotonic time of the last answered probe

    def attempt_timeout(self, entry: TowerEntry) -> float:
        """Seconds one small round trip with tower ``entry`` may take (connection.attempt_timeout)."""
        return attempt_timeout(entry.destination_hash, self.grid.health.get(entry.destination_hash).rtt_s)

    def refresh(self, entries: list[TowerEntry], max_age_s: float) -> None:
        """Probe the towers whose last answer is older than ``max_age_s``, all at once.

        Returns once all answered, or SILENT_AFTER_S (SILENT_FACTOR x the first
        answer's time if longer) after the first did: the rest rank last as
        silent while their probes go on, each within its own bounds."""
        now = time.monotonic()
        # On a radio link a probe is seconds of airtime: one is fresh for FRESH_RTTS round trips.
        stale = [e for e in entries if now - self._live_at.get(e.destination_hash, 0.0)
                 > max(max_age_s, FRESH_RTTS * self.grid.health.get(e.destination_hash).rtt_s)]
        if not stale:
            return
        done: queue.Queue[tuple[bytes, bool]] = queue.Queue()
        started = time.monotonic()
        for entry in stale:
            threading.Thread(target=self._probe, args=(entry, done), daemon=True).start()
        pending = {e.destination_hash for e in stale}
        # Every probe ends within its bounds; the cap only guards against a stuck thread.
        bound = max(self.attempt_timeout(e) for e in stale)
        cap = started + 2 * bound + max(FULL_TIMEOUT_S, FULL_RTTS * bound) + 1.0
        deadline = cap
        while pending:
            try:
                destination_hash, answered = done.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            pending.discard(destination_hash)
            if answered and deadline == cap:
                first = time.monotonic() - started
                deadline = min(cap, time.monotonic() + max(SILENT_AFTER_S, SILENT_FACTOR * first))
        for destination_hash in pending:
            self.grid.health.silent(destination_hash)

    def _probe(self, entry: TowerEntry, done: "queue.Queue[tuple[bytes, bool]]") -> None:
        """Ping ``entry``, then read its caps/full; records the outcome and puts
        (destination hash, answered) on ``done``."""
        grid, destination_hash, answered = self.grid, entry.destination_hash, False
        try:
            bound = self.attempt_timeout(entry)
            conn = grid.connection(entry)
            conn.ensure_link(bound)
            sent = time.monotonic()
            conn.request("ping", {}, bound, link_timeout=bound)
            rtt = time.monotonic() - sent
            try:  # caps/full is several packets: on a radio link (RTT of seconds) it takes many RTTs
                grid.ask_full(entry, max(FULL_TIMEOUT_S, FULL_RTTS * rtt), link_timeout=bound)
            except CapsError as e:  # it answered: alive, whatever it said
                log.warning("bad caps/full from %s: %s", entry.name, e)
            self._live_at[destination_hash] = time.monotonic()
            grid.health.rtt(destination_hash, rtt)
            answered = True
        except WireError as e:
            self.failed(entry, e)
        except Exception as e:  # a probe thread always reports back
            log.exception("probing %s failed", entry.name)
            grid.health.failed(destination_hash, f"{type(e).__name__}: {e}")
        finally:
            done.put((destination_hash, answered))

    def failed(self, entry: TowerEntry, error: WireError) -> None:
        """Record that tower ``entry`` failed with WireError ``error``; a silence
        (no answer, no Link, no path) may take it out of the table and makes
        the client ask the network again."""
        grid, destination_hash = self.grid, entry.destination_hash
        lost = error.code in LINK_LOST
        health = grid.health.failed(destination_hash, f"{error.code}: {error.message}", lost=lost)
        if not lost:
            return
        log.info("tower %s is silent (%s)", entry.name, error.message)
        if health.lost >= DROP_AFTER_LOST:
            log.info("tower %s left the table after %d silences in a row", entry.name, health.lost)
            grid.table.remove(destination_hash)
            conn = grid.connections.get(destination_hash)
            if conn is not None:
                conn.close()
        grid.ping(force=True)
        RNS.Transport.request_path(destination_hash)

    def look_again(self, model: str, tried: Mapping[bytes, float], adapter: str | None = None,
                   timeout: float = 6.0) -> list[router.Choice]:
        """Candidates for ``model`` after asking the network again (a discovery
        ping, a path request to every remembered tower not in the table or in
        ``tried``): towers not in ``tried`` ({destination hash: wall-clock time
        it failed}) or heard again since they failed. Waits up to ``timeout``
        seconds for one; best first, [] when none came."""
        grid = self.grid
        grid.ping(force=True)
        for destination_hash in remembered_towers():
            if grid.table.get(destination_hash) is None or destination_hash in tried:
                RNS.Transport.request_path(destination_hash)

        def fresh(entries: list[TowerEntry]) -> list[TowerEntry]:
            return [e for e in router.candidates(entries, model) if e.heard_at > tried.get(e.destination_hash, 0.0)]

        if not grid.table.wait_for(fresh, timeout):
            return []
        time.sleep(0.3)  # equally good towers answer the same ping
        entries = fresh(grid.table.live())
        for entry in entries:  # heard again since it failed: a fresh chance
            if entry.destination_hash in tried:
                grid.health.succeeded(entry.destination_hash)
        self.refresh(entries, 0.0)
        live = [grid.table.get(e.destination_hash) or e for e in entries]
        return router.rank(live, model, adapter, grid.health, grid.needs.get(model, 0))
