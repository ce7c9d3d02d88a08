"""When a tower announces, and how announces and discovery pings are heard.

Policy (DESIGN.md, "Discovery"): announce on start, on every material change
(``Caps.materially_differs``), when a client asks for discovery, and as a
heartbeat; never two announces closer than ``floor_s`` so a LoRa interface is
not flooded. Live load is *not* announced (transport nodes throttle chatty
destinations); clients ask ``caps/full`` over a Link for that.

Discovery ping: a client that just joined has missed the towers' last
announces, and heartbeats are many minutes apart. It announces its own
``rngrid.client`` destination once; each tower that hears it schedules an
announce (subject to the floor), so the client hears every tower within about
``floor_s`` plus the path's latency.

A client that heard towers before also sends each of them a path request
(``remembered_towers``): a tower answers those at once, on the interface the
request came from, with its current caps as app_data (the destination's
default app_data), so a returning client does not wait for the floor.
"""

import logging
import threading
import time
from collections.abc import Callable

import RNS

from announce import caps as capscodec
from announce.caps import Caps
from announce.table import TowerEntry, TowerTable

APP_NAME = "rngrid"
TOWER_ASPECT = "tower"
CLIENT_ASPECT = "client"
PING_APP_DATA = b"rngrid-discover/1"
#: Announces a tower on a radio-class interface sends per hour at most: RNS
#: transport nodes on radio throttle destinations that announce more often.
RADIO_ANNOUNCES_PER_H = 5

log = logging.getLogger("rngrid.announce")


def app_data_limit(ratchets: bool = False) -> int:
    """Largest announce app_data (bytes) that fits RNS's 500-byte MTU after a
    transport node re-sends the announce with a two-address (HEADER_2) header.

    Announce payload on rns 0.9.4: public key (64) + name hash (10) + random
    hash (10) + [ratchet (32)] + signature (64) + app_data (Destination.announce).
    Gives 317 bytes without ratchets; a transport node fails to re-send a
    bigger one (Packet.pack raises "exceeds MTU"), which tests measure.
    """
    fixed = (RNS.Identity.KEYSIZE // 8 + RNS.Identity.NAME_HASH_LENGTH // 8 + 10
             + RNS.Identity.SIGLENGTH // 8 + (RNS.Identity.RATCHETSIZE // 8 if ratchets else 0))
    return RNS.Reticulum.MTU - RNS.Reticulum.HEADER_MAXSIZE - fixed


def tower_destination_hash(identity: RNS.Identity) -> bytes:
    """The destination hash a tower with ``identity`` serves on (16 bytes)."""
    return RNS.Destination.hash(identity, APP_NAME, TOWER_ASPECT)


def remembered_towers(max_age_s: float = 7 * 86400, limit: int = 16) -> list[bytes]:
    """Tower destination hashes (16 bytes) this RNS instance heard announced
    within ``max_age_s`` seconds, most recent first, at most ``limit``. RNS keeps
    the identities of announced destinations in its storage across restarts."""
    now = time.time()
    heard: list[tuple[float, bytes]] = []
    for destination_hash, entry in list(RNS.Identity.known_destinations.items()):
        identity = RNS.Identity.recall(destination_hash)
        if (now - entry[0] <= max_age_s and identity is not None
                and tower_destination_hash(identity) == destination_hash):
            heard.append((entry[0], destination_hash))
    return [h for _, h in sorted(heard, reverse=True)[:limit]]


class TowerListener:
    """RNS announce handler: decodes tower caps into a TowerTable.

    Hostile or broken app_data is logged with the reason and ignored."""

    receive_path_responses = True

    def __init__(self, table: TowerTable, on_tower: Callable[[TowerEntry | None], None] | None = None) -> None:
        self.aspect_filter = f"{APP_NAME}.{TOWER_ASPECT}"
        self.table = table
        self.on_tower = on_tower
        self.rejected = 0

    def received_announce(self, destination_hash: bytes, announced_identity: RNS.Identity | None,
                          app_data: bytes | None) -> None:
        try:
            caps = capscodec.decode(app_data)
        except capscodec.CapsError as e:
            self.rejected += 1
            log.warning("ignored announce from %s: %s", destination_hash.hex(), e)
            return
        entry = self.table.update(destination_hash, caps, RNS.Transport.hops_to(destination_hash))
        if self.on_tower is not None:
            self.on_tower(entry)


class PingListener:
    """RNS announce handler on towers: a client discovery ping triggers an announce."""

    receive_path_responses = False

    def __init__(self, announcer: "Announcer") -> None:
        self.aspect_filter = f"{APP_NAME}.{CLIENT_ASPECT}"
        self.announcer = announcer

    def received_announce(self, destination_hash: bytes, announced_identity: RNS.Identity | None,
                          app_data: bytes | None) -> None:
        if app_data == PING_APP_DATA:
            self.announcer.request("discovery ping")


class Pinger:
    """Sends discovery pings: announces of this client's ``rngrid.client`` destination."""

    def __init__(self, identity: RNS.Identity) -> None:
        self.destination = RNS.Destination(identity, RNS.Destination.IN, RNS.Destination.SINGLE,
                                           APP_NAME, CLIENT_ASPECT)

    def ping(self) -> None:
        self.destination.announce(app_data=PING_APP_DATA)


class Announcer:
    """Announces a tower destination with its caps, following the policy above.

    ``caps_fn()`` returns the current Caps. Times are seconds."""

    def __init__(self, destination: RNS.Destination, caps_fn: Callable[[], Caps], heartbeat_s: float = 900.0,
                 floor_s: float = 5.0, check_s: float = 2.0, budget: int | None = None,
                 budget_window_s: float = 3600.0) -> None:
        self.destination = destination
        self.caps_fn = caps_fn
        self.heartbeat_s = heartbeat_s
        self.floor_s = floor_s
        self.check_s = check_s
        # At most ``budget`` announces in any ``budget_window_s`` (None: no budget):
        # on radio, transport nodes throttle destinations that announce more.
        self.budget, self.budget_window_s = budget, budget_window_s
        self._recent: list[float] = []
        self.count = 0
        self.last_reason: str | None = None
        self._last_at: float | None = None
        self._last_caps: Caps | None = None
        self._pending: str | None = None
        self._wake = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="rngrid-announcer", daemon=True)

    def start(self) -> None:
        self.request("start")
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify_all()

    def request(self, reason: str) -> None:
        """Ask for an announce as soon as the floor allows."""
        with self._wake:
            if self._pending is None:
                self._pending = reason
            self._wake.notify_all()

    def _run(self) -> None:
        while True:
            with self._wake:
                if self._stopped:
                    return
                now = time.monotonic()
                reason = self._due(now)
                if reason is None:
                    self._wake.wait(self._sleep_for(now))
                    continue
                self._pending = None
            self._announce(reason)

    def _budget_free_at(self, now: float) -> float:
        """When the budget next allows an announce (``now`` if it does)."""
        self._recent = [t for t in self._recent if now - t < self.budget_window_s]
        if self.budget is None or len(self._recent) < self.budget:
            return now
        return self._recent[0] + self.budget_window_s

    def _due(self, now: float) -> str | None:
        since = None if self._last_at is None else now - self._last_at
        if since is not None and since < self.floor_s:
            return None
        if self._budget_free_at(now) > now:
            return None
        if self._pending is not None:
            return self._pending
        if since is not None and since >= self.heartbeat_s:
            return "heartbeat"
        try:
            if self.caps_fn().materially_differs(self._last_caps):
                return "material change"
        except Exception as e:
            log.error("caps unavailable: %s", e)
        return None

    def _sleep_for(self, now: float) -> float:
        if self._pending is not None and self._last_at is not None:
            return max(0.01, self._last_at + self.floor_s - now, self._budget_free_at(now) - now)
        return self.check_s

    def app_data(self) -> bytes | None:
        """The current caps, encoded (bytes); None if they cannot be built."""
        try:
            return capscodec.encode(self.caps_fn())
        except Exception as e:
            log.error("caps for a path response failed: %s", e)
            return None

    def _announce(self, reason: str) -> None:
        try:
            caps = self.caps_fn()
            self.destination.announce(app_data=capscodec.encode(caps))
        except Exception as e:
            log.error("announce failed (%s): %s", reason, e)
            return
        with self._wake:
            self._last_at = time.monotonic()
            self._recent.append(self._last_at)
            self._last_caps = caps
            self.count += 1
            self.last_reason = reason
        log.info("announced (%s)", reason)
