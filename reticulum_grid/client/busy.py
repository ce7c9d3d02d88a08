"""Waiting out a busy grid, for every client (``Grid``, ``rngrid infer``, the gateway).

A tower whose model's slots all run and whose line is full answers "busy"
with a retry hint: the seconds until a place in its line opens, never more
than the time left on the stream whose end opens it (inference/admission.py).
Busy always comes before any output, so asking again repeats nothing. A
client given ``busy_wait`` seconds, told busy by every tower it tried, waits
for the earliest of

- the shortest hint a tower gave,
- a tower holding the model announcing room: a free slot or a free place in
  its queue (caps carry both for each loaded model, and a tower re-announces
  when its last slot or queue place is taken or one frees; a queued request
  takes a freed slot at once, so a freed queue place is often the only sign),
  or showing room in a ``caps/full`` heard since,
- its deadline, or a cancel,

then asks again (re-ranking the towers). When the deadline came first it
still asks once more, so a place that freed meanwhile is taken and a refusal
carries the latest hint; only after that last ask does the caller see the
busy error.
"""

import logging
import threading
import time
from collections.abc import Callable, Collection

from announce.table import TowerEntry
from links.wire import WireError
from reticulum_grid.client.parts import GridParts


log = logging.getLogger("rngrid.client")

#: Never ask again sooner than this after a busy answer (seconds): a hint of 0 would spin.
MIN_PAUSE_S = 0.2
#: The pause when a busy answer carries no hint (seconds).
DEFAULT_PAUSE_S = 1.0


def room(entry: TowerEntry, model: str) -> str | None:
    """What the table ``entry`` says ``model`` has room in ("a free slot", "a
    free queue place"), or None when it is not loaded there or has none."""
    cap = entry.caps.model(model)
    if cap is None or not cap.loaded:
        return None
    return "a free slot" if cap.free > 0 else "a free queue place" if cap.queue_free > 0 else None


class BusyWait:
    """The busy-wait of one request: ``seconds`` from now at most (0: none);
    ``on_busy(error, pause_s)`` is told before each wait (the CLI says so)."""

    def __init__(self, grid: GridParts, seconds: float | None,
                 on_busy: Callable[[WireError, float], None] | None = None) -> None:
        self.grid = grid
        self.deadline = time.monotonic() + max(0.0, seconds or 0.0)
        self.on_busy = on_busy
        self.stopped = threading.Event()
        self.waits = 0

    def stop(self) -> None:
        """Wake a wait at once (a cancel); later waits return False."""
        self.stopped.set()

    def wait(self, model: str, error: WireError, exclude: Collection[bytes] = ()) -> bool:
        """After the busy WireError ``error``: wait as the module doc says. True
        when it is worth asking again (the last time when the deadline came);
        False once the deadline has passed (or the wait was stopped) and the
        caller should give up. ``exclude``: destination hashes whose room does
        not count (towers that refused for another reason)."""
        left = self.deadline - time.monotonic()
        if left <= 0 or self.stopped.is_set():
            return False
        hint = error.retry_after if error.retry_after is not None else DEFAULT_PAUSE_S
        pause = min(max(MIN_PAUSE_S, hint), left)
        log.info("every tower with %s is busy (%s); asking again within %.1f s, sooner if a place frees",
                 model, error.message, pause)
        if self.on_busy is not None:
            self.on_busy(error, pause)
        since = time.time()
        self.waits += 1

        def woken(entries: list[TowerEntry]) -> str | None:
            if self.stopped.is_set():
                return "a cancel"
            return next((found for e in entries if e.heard_at > since and e.destination_hash not in exclude
                         and (found := room(e, model))), None)

        freed = self.grid.table.wait_for(woken, pause)
        if self.stopped.is_set():
            return False
        if freed:
            log.info("a tower with %s announced %s: asking again now", model, freed)
        elif pause >= left:
            log.info("waited for a place on a tower with %s until the deadline: asking a last time", model)
        return True
