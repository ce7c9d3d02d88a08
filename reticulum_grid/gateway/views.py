"""What the grid looks like right now, as JSON: towers, models, jobs.

Served by ``/v1/grid/towers``, ``/v1/models``, ``/v1/grid/jobs`` and Ollama's
``/api/tags``, ``/api/show`` and ``/api/ps``, and read by the dashboard. These are blocking (they ask towers over their Links) and
run in a worker thread; answers are kept for ``max_age_s`` so that several
dashboards polling at once ask each tower at most about once a second.
"""

import threading
import time

from links.wire import WireError

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
        """[tower map]: name, destination, hops, age_s, backend, device, memory (MiB),
        models, adapters, voice (engines: alias, kind stt/tts, language, realtime x, free), load (streams,
        queue, jobs), tokens_per_s, rtt_ms, backed_off."""
        return [self.tower(e) for e in self.live()]

    def tower(self, entry):
        hw, caps = entry.caps.hardware, entry.caps
        health = self.grid.health.get(entry.destination_hash)
        return {"name": entry.name, "destination": entry.hash_hex, "hops": entry.hops, "age_s": round(entry.age(), 1),
                "backend": hw.backend, "device": hw.device,
                "memory": {"kind": "VRAM" if hw.vram_total_mib else "RAM", "free_mib": hw.memory_free_mib,
                           "total_mib": hw.memory_total_mib},
                "vram_free_mib": hw.vram_free_mib, "vram_total_mib": hw.vram_total_mib,
                "ram_free_mib": hw.ram_free_mib, "ram_total_mib": hw.ram_total_mib,
                "models": [{"alias": m.alias, "blob": m.short_hex, "loaded": m.loaded} for m in caps.models],
                "adapters": [{"alias": a.alias, "blob": a.short_hex} for a in caps.adapters],
                "voice": [{"alias": v.alias, "kind": v.kind, "language": v.language, "realtime": v.realtime,
                           "free": v.free} for v in caps.voice],
                "load": {"streams": caps.load.streams, "queue": caps.load.queue, "jobs": caps.load.jobs},
                "tokens_per_s": caps.tokens_per_s, "rtt_ms": round(health.rtt_s * 1000, 1),
                "backed_off": health.backed_off()}

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
