"""What the grid looks like right now, as JSON: towers, models, jobs.

Served by ``/v1/grid/towers``, ``/v1/models``, ``/v1/grid/jobs`` and Ollama's
``/api/tags``, ``/api/show`` and ``/api/ps``, and read by the dashboard. These are blocking (they ask towers over their Links) and
run in a worker thread; answers are kept for ``max_age_s`` so that several
dashboards polling at once ask each tower at most about once a second.
"""

import threading
import time

from links.wire import WireError
from reticulum_grid.client.rows import tower_row

#: Seconds an answer is reused.
MAX_AGE_S = 1.0
#: Seconds a tower gets to answer jobs/status.
JOBS_TIMEOUT_S = 5.0


class Views:
    def __init__(self, grid, max_age_s=MAX_AGE_S):
        self.grid = grid
        self.max_age_s = max_age_s
        self._cache = {}
        self._locks = {"towers": threading.Lock(), "jobs": threading.Lock(), "models": threading.Lock()}

    def _cached(self, key, compute):
        with self._locks[key]:  # one computation at a time; the others reuse it
            at, value = self._cache.get(key, (0.0, None))
            if time.monotonic() - at > self.max_age_s:
                value = compute()
                self._cache[key] = (time.monotonic(), value)
            return value

    def live(self):
        """Live table entries, their load refreshed over caps/full (at most once a second)."""
        return self._cached("towers", self._refresh)

    def _refresh(self):
        entries = self.grid.table.live()
        self.grid.refresh(entries)
        return [self.grid.table.get(e.destination_hash) or e for e in entries]

    def towers(self):
        """[tower map]: each live tower's row (client/rows.py tower_row, as ``rngrid towers --json``)."""
        return [tower_row(e, self.grid.health.get(e.destination_hash)) for e in self.live()]

    def models(self):
        """OpenAI's model list: every model and adapter a live tower holds, with
        ``rngrid`` = {kind, blob, towers: [{name, loaded}]}. An adapter is used as
        ``MODEL:ADAPTER`` (or the ``adapter`` field)."""
        found = {}
        for entry in self.live():
            for kind, items in (("model", entry.caps.models), ("adapter", entry.caps.adapters)):
                for item in items:
                    row = found.setdefault((kind, item.alias), {
                        "id": item.alias, "object": "model", "created": 0, "owned_by": "rngrid",
                        "rngrid": {"kind": kind, "blob": item.short_hex, "towers": []}})
                    row["rngrid"]["towers"].append({"name": entry.name, "loaded": bool(getattr(item, "loaded", True))})
        return sorted(found.values(), key=lambda r: (r["rngrid"]["kind"], r["id"]))

    def tower_models(self):
        """[client.models.TowerModel]: every blob each live tower holds, with where
        a loaded model sits, its slots and what it is (from caps/full)."""
        return self._cached("models", self._tower_models)

    def _tower_models(self):
        entries = self.live()
        return self.grid.tower_models(entries)

    def model_aliases(self):
        """Model aliases the live towers hold (from their announces; no round trip)."""
        return {m.alias for e in self.grid.table.live() for m in e.caps.models}

    def jobs(self, fresh=False):
        """[job map + "tower"] of this identity's training jobs on every live tower
        that lets it train, newest first (towers that refuse or do not answer are
        left out); ``fresh`` asks the towers now instead of reusing an answer."""
        return self._jobs() if fresh else self._cached("jobs", self._jobs)

    def _jobs(self):
        results = []

        def ask(entry):
            try:
                reply = self.grid.connection(entry).request("jobs/status", {}, JOBS_TIMEOUT_S)
                results.extend({"tower": entry.name, **job} for job in reply.get("jobs", ()))
            except WireError:  # not allowed to train there, or gone: not our jobs to show
                pass

        threads = [threading.Thread(target=ask, args=(e,), daemon=True) for e in self.grid.table.live()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(JOBS_TIMEOUT_S + 16)
        return sorted(results, key=lambda j: -(j.get("created") or 0))
