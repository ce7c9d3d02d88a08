"""Tower table: who is out there, as heard from announces and caps/full replies.

Thread-safe. An entry expires ``EXPIRY_HEARTBEATS`` heartbeats (as the tower
itself declares in its caps) after it was last heard, unless refreshed.
Petals keeps ~2x its announce period; we keep 2.5x so one lost heartbeat on a
lossy radio link does not drop a tower.
"""

import threading
import time
from dataclasses import dataclass, replace

EXPIRY_HEARTBEATS = 2.5


@dataclass(frozen=True)
class TowerEntry:
    """One tower as heard. ``heard_at`` is wall-clock seconds (time.time())."""
    destination_hash: bytes
    caps: object
    hops: int
    heard_at: float

    @property
    def name(self):
        return self.caps.name

    @property
    def hash_hex(self):
        return self.destination_hash.hex()

    def expires_at(self):
        return self.heard_at + EXPIRY_HEARTBEATS * self.caps.heartbeat_s

    def age(self, now=None):
        return max(0.0, (now if now is not None else time.time()) - self.heard_at)


class TowerTable:
    """Destination hash -> TowerEntry, with expiry and waiting."""

    def __init__(self, clock=time.time):
        self._clock = clock
        self._entries = {}
        self._changed = threading.Condition()

    def update(self, destination_hash, caps, hops):
        """Insert or refresh a tower; returns the new entry."""
        entry = TowerEntry(bytes(destination_hash), caps, int(hops), self._clock())
        with self._changed:
            self._entries[entry.destination_hash] = entry
            self._changed.notify_all()
        return entry

    def refresh_caps(self, destination_hash, caps):
        """Replace caps (e.g. from caps/full) keeping hops; no-op for unknown towers."""
        with self._changed:
            old = self._entries.get(destination_hash)
            if old is None:
                return None
            entry = replace(old, caps=caps, heard_at=self._clock())
            self._entries[destination_hash] = entry
            self._changed.notify_all()
            return entry

    def remove(self, destination_hash):
        with self._changed:
            self._entries.pop(destination_hash, None)

    def get(self, destination_hash):
        entry = self._entries.get(destination_hash)
        return entry if entry is not None and not self._expired(entry) else None

    def live(self):
        """Unexpired entries, most recently heard first."""
        with self._changed:
            self._expire()
            return sorted(self._entries.values(), key=lambda e: -e.heard_at)

    def find(self, name_or_hash):
        """The live entry whose full hash, hash prefix (>= 8 hex) or name matches
        one tower only. Names are not authenticated: two towers announcing the
        same name match neither (use the hash)."""
        key = name_or_hash.lower()
        live = self.live()
        for entry in live:
            if entry.hash_hex == key:
                return entry
        prefixed = [e for e in live if len(key) >= 8 and e.hash_hex.startswith(key)]
        if len(prefixed) == 1:
            return prefixed[0]
        named = [e for e in live if e.name == name_or_hash]
        return named[0] if len(named) == 1 else None

    def named(self, name):
        """Live entries announcing ``name``."""
        return [e for e in self.live() if e.name == name]

    def wait_for(self, predicate, timeout):
        """Block until ``predicate(live_entries)`` is truthy or ``timeout`` seconds pass.

        Returns the predicate's last value."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                self._expire()
                result = predicate(sorted(self._entries.values(), key=lambda e: -e.heard_at))
                remaining = deadline - time.monotonic()
                if result or remaining <= 0:
                    return result
                self._changed.wait(min(remaining, 0.25))

    def _expired(self, entry):
        return self._clock() > entry.expires_at()

    def _expire(self):
        for key in [k for k, e in self._entries.items() if self._expired(e)]:
            del self._entries[key]
