"""What the Grid client asks of towers' caps/full, and what it keeps of the answers.

A mixin of ``Grid`` (client/grid.py): it uses the Grid's table, Links and
bookkeeping (needs, model facts, served sizes, data planes). Every reply is
decoded once, by announce/capsfull.py.
"""

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from announce.capsfull import CapsError, CapsFull
from announce.table import TowerEntry
from links.wire import LINK_LOST, WireError
from reticulum_grid.client.models import TowerModel

if TYPE_CHECKING:
    from reticulum_grid.client.parts import GridParts as _Parts
else:
    _Parts = object  # the mixin's base for the type checker only (client/parts.py)

log = logging.getLogger("rngrid.client")


class TowerFacts(_Parts):
    """caps/full methods of ``Grid``."""

    def tower_models(self, entries: Sequence[TowerEntry] | None = None,
                     timeout: float = 10.0) -> list[TowerModel]:
        """[models.TowerModel] of every model and adapter the live towers (or
        ``entries``) hold, from their caps/full, asked all at once."""
        entries = self.table.live() if entries is None else entries
        return [TowerModel.of(entry.name, blob) for entry, full in self.caps_full(entries, timeout)
                for blob in full.blobs if blob.kind in ("model", "adapter") and blob.alias]

    def caps_full(self, entries: Sequence[TowerEntry], timeout: float = 10.0) -> list[tuple[TowerEntry, CapsFull]]:
        """[(entry, CapsFull)] of the towers that answer within ``timeout``
        seconds, asked all at once (each entry refreshed by its answer, see
        ask_full). A tower that fails, or answers what does not decode, is
        left out (logged)."""
        return [(entry, full) for entry, full, _ in self.caps_full_timed(entries, timeout)]

    def caps_full_timed(self, entries: Sequence[TowerEntry],
                        timeout: float = 10.0) -> list[tuple[TowerEntry, CapsFull, float]]:
        """caps_full with each answer's round trip (seconds) third."""
        results: list[tuple[TowerEntry, CapsFull, float]] = []

        def ask(entry: TowerEntry) -> None:
            try:
                started = time.monotonic()
                entry, full = self.ask_full(entry, timeout, link_timeout=self.liveness.attempt_timeout(entry))
                results.append((entry, full, time.monotonic() - started))
            except WireError as e:
                log.info("no caps/full from %s: %s", entry.name, e)
                if e.code in LINK_LOST:
                    self.liveness.failed(entry, e)
            except CapsError as e:
                log.warning("bad caps/full from %s: %s", entry.name, e)

        threads = [threading.Thread(target=ask, args=(e,), daemon=True) for e in entries]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout + 16)
        return list(results)

    def ask_full(self, entry: TowerEntry, timeout: float = 30.0,
                 link_timeout: float = 15.0) -> tuple[TowerEntry, CapsFull]:
        """Ask tower ``entry`` for caps/full (within ``timeout`` seconds, and
        ``link_timeout`` to set up a Link) and learn from it (``learn``): (its
        refreshed entry, the decoded reply). Raises WireError, CapsError."""
        full = CapsFull.from_map(self.connection(entry).request("caps/full", {}, timeout, link_timeout))
        return self.learn(entry, full), full

    def learn(self, entry: TowerEntry, full: CapsFull) -> TowerEntry:
        """Keep what tower ``entry``'s caps/full says: its caps (in the table),
        each model's memory need (routing), bytes, bytes a token reads and
        embedding width (split estimates), what a token reads of the largest
        model it serves (its bandwidth, client/estimates.py), whether it offers a data plane and the size of
        the draft its split of each model runs with. Returns the
        refreshed entry (``entry`` when the table no longer has it)."""
        key = entry.destination_hash
        self.dataplanes[key] = full.dataplane
        models = [b for b in full.blobs if b.kind == "model" and b.alias]
        largest = max((b for b in models if b.loaded), key=lambda b: b.size, default=None)
        self.served[key] = 0 if largest is None else largest.read_bytes or largest.size
        self.drafts[key] = {b.alias: b.draft_bytes for b in models if b.draft_bytes}
        for blob in models:
            if blob.need_mib is not None:
                self.needs[blob.alias] = blob.need_mib
            known = self.model_facts.setdefault(blob.alias, {})
            known["bytes"] = blob.size
            if blob.embedding is not None:
                known["embedding"] = blob.embedding
            if blob.read_bytes:
                known["read_bytes"] = blob.read_bytes
            if blob.expert_bytes:
                known["expert_bytes"] = blob.expert_bytes
                known["expert_read_bytes"] = blob.expert_read_bytes
        return self.table.refresh_caps(key, full.caps) or entry
