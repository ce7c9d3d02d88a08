"""Waiting out a busy grid, for every client (``Grid``, ``rngrid infer``, the gateway).

A tower whose model's slots all run and whose line is full answers "busy"
with a retry hint: the seconds until a place in its line opens
(inference/admission.py). Busy always comes before any output, so asking
again repeats nothing. A client given ``busy_wait`` seconds, told busy by
every tower it tried, waits for the earliest of

- the shortest hint a tower gave,
- a tower holding the model announcing a free slot (caps carry each loaded
  model's free slots, and a tower re-announces when its last slot is taken
  or one frees), or showing one in a ``caps/full`` heard since,
- its deadline, or a cancel,

then asks again (re-ranking the towers). Only once the deadline has passed
does the caller see the busy error.
"""

import logging
import threading
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from announce.table import TowerEntry
from links.wire import WireError

if TYPE_CHECKING:
    from reticulum_grid.client.grid import Grid

log = logging.getLogger("rngrid.client")

#: Never ask again sooner than this after a busy answer (seconds): a hint of 0 would spin.
MIN_PAUSE_S = 0.2
#: The pause when a busy answer carries no hint (seconds).
DEFAULT_PAUSE_S = 1.0


def free_slot(entry: TowerEntry, model: str) -> bool:
    """Whether the table ``entry`` says ``model`` is loaded there with a free slot."""
    cap = entry.caps.model(model)
    return cap is not None and cap.loaded and cap.free > 0


class BusyWait:
    """The busy-wait of one request: ``seconds`` from now at most (0: none);
    ``on_busy(error, pause_s)`` is told before each wait (the CLI says so)."""

    def __init__(self, grid: "Grid", seconds: float | None,
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
        when it is worth asking again; False when the deadline came first (or the
        wait was stopped) and the caller should give up. ``exclude``: destination
        hashes whose free slots do not count (towers that refused for another reason)."""
        left = self.deadline - time.monotonic()
        if left <= 0 or self.stopped.is_set():
            return False
        hint = error.retry_after if error.retry_after is not None else DEFAULT_PAUSE_S
        pause = min(max(MIN_PAUSE_S, hint), left)
        log.info("every tower with %s is busy (%s); asking again within %.1f s, sooner if a slot frees",
                 model, error.message, pause)
        if self.on_busy is not None:
            self.on_busy(error, pause)
        since = time.time()
        self.waits += 1

        def woken(entries: list[TowerEntry]) -> bool:
            return self.stopped.is_set() or any(
                free_slot(e, model) and e.heard_at > since and e.destination_hash not in exclude for e in entries)

        freed = self.grid.table.wait_for(woken, pause)
        if self.stopped.is_set():
            return False
        if freed:
            log.info("a tower with %s announced a free slot: asking again now", model)
        # Cut short by the deadline with nothing freed: asking again would only hear busy.
        return bool(freed) or pause < left
