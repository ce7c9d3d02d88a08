"""What the grid looks like right now, as JSON: towers, models, jobs.

Served by ``/v1/grid/towers``, ``/v1/models``, ``/v1/grid/jobs`` and Ollama's
``/api/tags``, ``/api/show`` and ``/api/ps``, and read by the dashboard. These are blocking (they ask towers over their Links) and
run in a worker thread; answers are kept for ``max_age_s`` so that several
dashboards polling at once ask each tower at most about once a second.
"""

import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from announce.table import TowerEntry
from links.wire import WireError
from reticulum_grid.client import Grid
from reticulum_grid.client.models import TowerModel
from reticulum_grid.client.rows import tower_row

#: Seconds an answer is reused.
MAX_AGE_S = 1.0
#: Seconds a tower gets to answer jobs/status.
JOBS_TIMEOUT_S = 5.0
T = TypeVar("T")


class _Kept(Generic[T]):
    """``compute()``'s answer, reused for ``max_age_s`` seconds."""

    def __init__(self, compute: Callable[[], T], max_age_s: float) -> None:
        self.compute, self.max_age_s = compute, max_age_s
        self._kept: tuple[float, T] | None = None  # (time.monotonic() when computed, the answer)
        self._lock = threading.Lock()

    def get(self) -> T:
        with self._lock:  # one computation at a time; the others reuse it
            kept = self._kept
            if kept is None or time.monotonic() - kept[0] > self.max_age_s:
                value = self.compute()
                kept = self._kept = (time.monotonic(), value)
            return kept[1]


class Views:
    def __init__(self, grid: Grid, max_age_s: float = MAX_AGE_S) -> None:
        self.grid = grid
        self.max_age_s = max_age_s
        self._kept_live = _Kept(self._refresh, max_age_s)
        self._kept_jobs = _Kept(self._jobs, max_age_s)
        self._kept_models = _Kept(self._tower_models, max_age_s)

    def live(self) -> list[TowerEntry]:
        """Live table entries, their load refreshed over caps/full (at most once a second)."""
        return self._kept_live.get()

    def _refresh(self) -> list[TowerEntry]:
        entries = self.grid.table.live()
        self.grid.refresh(entries)
        return [self.grid.table.get(e.destination_hash) or e for e in entries]

    def towers(self) -> list[dict[str, Any]]:
        """[tower map]: each live tower's row (client/rows.py tower_row, as ``rngrid towers --json``)."""
        return [tower_row(e, self.grid.health.get(e.destination_hash)) for e in self.live()]

    def models(self) -> list[dict[str, Any]]:
        """OpenAI's model list: every model and adapter a live tower holds, with
        ``rngrid`` = {kind, blob, towers: [{name, loaded}]}. An adapter is used as
        ``MODEL:ADAPTER`` (or the ``adapter`` field)."""
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for entry in self.live():
            for kind, items in (("model", entry.caps.models), ("adapter", entry.caps.adapters)):
                for item in items:
                    row = found.setdefault((kind, item.alias), {
                        "id": item.alias, "object": "model", "created": 0, "owned_by": "rngrid",
                        "rngrid": {"kind": kind, "blob": item.short_hex, "towers": []}})
                    row["rngrid"]["towers"].append({"name": entry.name, "loaded": bool(getattr(item, "loaded", True))})
        return sorted(found.values(), key=lambda r: (r["rngrid"]["kind"], r["id"]))

    def tower_models(self) -> list[TowerModel]:
        """[client.models.TowerModel]: every blob each live tower holds, with where
        a loaded model sits, its slots and what it is (from caps/full)."""
        return self._kept_models.get()

    def _tower_models(self) -> list[TowerModel]:
        entries = self.live()
        return self.grid.tower_models(entries)

    def model_aliases(self) -> set[str]:
        """Model aliases the live towers hold (from their announces; no round trip)."""
        return {m.alias for e in self.grid.table.live() for m in e.caps.models}

    def jobs(self, fresh: bool = False) -> list[dict[str, Any]]:
        """[job map + "tower"] of this identity's training jobs on every live tower
        that lets it train, newest first (towers that refuse or do not answer are
        left out); ``fresh`` asks the towers now instead of reusing an answer."""
        return self._jobs() if fresh else self._kept_jobs.get()

    def _jobs(self) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = []

        def ask(entry: TowerEntry) -> None:
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
