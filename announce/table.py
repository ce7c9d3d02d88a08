"""Tower table: who is out there, as heard from announces and caps/full replies.

Thread-safe. An entry expires ``EXPIRY_HEARTBEATS`` heartbeats (as the tower
itself declares in its caps) after it was last heard, unless refreshed.
Petals keeps ~2x its announce period; we keep 2.5x so one lost heartbeat on a
lossy radio link does not drop a tower.

A table may ``vet`` what it hears: ``vet(destination_hash, caps)`` returns
``(caps, trusted)`` for a tower to use (its caps possibly renamed: a client
names a tower as its trust entry says) or None for one to keep apart. Towers
kept apart are only listed (``strangers``); every other method sees the vetted
ones alone. When ``vet.version`` changes (the client's trust list was edited)
every entry is vetted again.

Caps a tower stamped (caps.py ``at``) earlier than those held are dropped:
an announce a transport node forwarded late must not undo a caps/full reply
the tower gave after it (a training job that started, a slot taken). A stamp
more than MAX_REORDER_S older than the held one is taken: the tower restarted
with its clock set back, which no late forward explains.
"""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from announce.caps import Caps

T = TypeVar("T")

EXPIRY_HEARTBEATS = 2.5
#: Caps stamped up to this much earlier than the held ones are a late arrival (seconds).
MAX_REORDER_S = 120.0


@dataclass(frozen=True)
class TowerEntry:
    """One tower as heard. ``heard_at`` is wall-clock seconds (time.time())."""
    destination_hash: bytes
    caps: Caps
    hops: int
    heard_at: float
    trusted: bool = True  # False: heard and used only because the client uses every tower (trust any)

    @property
    def name(self) -> str:
        return self.caps.name

    @property
    def hash_hex(self) -> str:
        return self.destination_hash.hex()

    def expires_at(self) -> float:
        return self.heard_at + EXPIRY_HEARTBEATS * self.caps.heartbeat_s

    def age(self, now: float | None = None) -> float:
        return max(0.0, (now if now is not None else time.time()) - self.heard_at)


class TowerTable:
    """Destination hash -> TowerEntry, with expiry, waiting and vetting (see above)."""

    def __init__(self, clock: Callable[[], float] = time.time,
                 vet: Callable[[bytes, Caps], tuple[Caps, bool] | None] | None = None) -> None:
        self._clock = clock
        self._vet = vet
        self._version: Any = getattr(vet, "version", None)
        self._heard: dict[bytes, TowerEntry] = {}  # destination hash -> TowerEntry as announced
        self._entries: dict[bytes, TowerEntry] = {}  # destination hash -> vetted TowerEntry
        self._changed = threading.Condition()

    def _vetted(self, heard: TowerEntry) -> TowerEntry | None:
        if self._vet is None:
            return heard
        verdict = self._vet(heard.destination_hash, heard.caps)
        return None if verdict is None else replace(heard, caps=verdict[0], trusted=bool(verdict[1]))

    def _put(self, heard: TowerEntry) -> TowerEntry | None:
        """Store ``heard`` and its vetted entry (the lock is held). Returns the vetted one or None."""
        self._heard[heard.destination_hash] = heard
        entry = self._vetted(heard)
        if entry is None:
            self._entries.pop(heard.destination_hash, None)
        else:
            self._entries[heard.destination_hash] = entry
        self._changed.notify_all()
        return entry

    def _revet(self) -> None:
        """Vet everything again when the vet's verdicts may have changed (the lock is held)."""
        version = getattr(self._vet, "version", None)
        if version != self._version:
            self._version = version
            self._entries = {}
            for heard in list(self._heard.values()):
                self._put(heard)

    def update(self, destination_hash: bytes, caps: Caps, hops: int) -> TowerEntry | None:
        """Insert or refresh a tower; returns its vetted entry (None: kept apart)."""
        with self._changed:
            self._revet()
            if self._stale(destination_hash, caps):
                return self._entries.get(destination_hash)
            return self._put(TowerEntry(bytes(destination_hash), caps, int(hops), self._clock()))

    def refresh_caps(self, destination_hash: bytes, caps: Caps) -> TowerEntry | None:
        """Replace caps (e.g. from caps/full) keeping hops; no-op (None) for unknown or unvetted towers."""
        with self._changed:
            self._revet()
            old = self._heard.get(destination_hash)
            if old is None or destination_hash not in self._entries:
                return None
            if self._stale(destination_hash, caps):
                return self._entries[destination_hash]
            return self._put(replace(old, caps=caps, heard_at=self._clock()))

    def _stale(self, destination_hash: bytes, caps: Caps) -> bool:
        """``caps`` were taken before the held ones, by less than MAX_REORDER_S (the lock is held)."""
        old = self._heard.get(destination_hash)
        held = old.caps.at_ms if old is not None else 0
        return bool(caps.at_ms and held) and held - MAX_REORDER_S * 1000 <= caps.at_ms < held

    def remove(self, destination_hash: bytes) -> None:
        with self._changed:
            self._entries.pop(destination_hash, None)
            self._heard.pop(destination_hash, None)

    def get(self, destination_hash: bytes) -> TowerEntry | None:
        with self._changed:
            self._revet()
            entry = self._entries.get(destination_hash)
        return entry if entry is not None and not self._expired(entry) else None

    def live(self) -> list[TowerEntry]:
        """Unexpired vetted entries, most recently heard first."""
        with self._changed:
            self._revet()
            self._expire()
            return sorted(self._entries.values(), key=lambda e: -e.heard_at)

    def strangers(self) -> list[TowerEntry]:
        """Unexpired towers heard but kept apart by the vet (as they announced themselves)."""
        with self._changed:
            self._revet()
            self._expire()
            return sorted((e for h, e in self._heard.items() if h not in self._entries), key=lambda e: -e.heard_at)

    def find(self, name_or_hash: str) -> TowerEntry | None:
        """The live entry whose full hash, hash prefix (>= 8 hex) or name matches
        one tower only. A trusted tower's name is its trust entry's; a name that
        a trusted tower and untrusted ones share (trust any) is the trusted
        tower's; two towers with one name otherwise match neither (use the hash)."""
        key = name_or_hash.lower()
        live = self.live()
        for entry in live:
            if entry.hash_hex == key:
                return entry
        prefixed = [e for e in live if len(key) >= 8 and e.hash_hex.startswith(key)]
        if len(prefixed) == 1:
            return prefixed[0]
        named = [e for e in live if e.name == name_or_hash]
        trusted = [e for e in named if e.trusted]
        named = trusted or named
        return named[0] if len(named) == 1 else None

    def named(self, name: str) -> list[TowerEntry]:
        """Live entries called ``name``."""
        return [e for e in self.live() if e.name == name]

    def wait_for(self, predicate: Callable[[list[TowerEntry]], T], timeout: float) -> T:
        """Block until ``predicate(live_entries)`` is truthy or ``timeout`` seconds pass.

        Returns the predicate's last value."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                self._revet()
                self._expire()
                result = predicate(sorted(self._entries.values(), key=lambda e: -e.heard_at))
                remaining = deadline - time.monotonic()
                if result or remaining <= 0:
                    return result
                self._changed.wait(min(remaining, 0.25))

    def _expired(self, entry: TowerEntry) -> bool:
        return self._clock() > entry.expires_at()

    def _expire(self) -> None:
        for table in (self._entries, self._heard):
            for key in [k for k, e in table.items() if self._expired(e)]:
                del table[key]
