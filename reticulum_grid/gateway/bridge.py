"""Blocking Grid calls seen from asyncio, and client disconnects seen by them.

The Grid is synchronous (RNS threads, blocking Links), so each request's grid
work runs on a thread of its own (``Call``) and its events cross to the event
loop through an asyncio queue. A client that goes away (closed socket,
aborted fetch) stops its call at once, even while nothing is being sent
(intake.py sets the request's ``rngrid.gone``).
"""

import asyncio
import logging
import threading
from collections import deque
from collections.abc import AsyncGenerator, Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, cast

from reticulum_grid.client import Text

log = logging.getLogger("rngrid.gateway")

E = TypeVar("E")
T = TypeVar("T")
E_contra = TypeVar("E_contra", contravariant=True)


class Reporter(Protocol[E_contra]):
    """What a grid call's ``work`` is handed: a Call here, or ``rngrid
    execute``'s own that prints each event (cli/execute.py)."""
    stopped: threading.Event

    def emit(self, event: E_contra) -> None: ...

    def on_stop(self, fn: Callable[[], None]) -> None: ...


#: ``work(call)``: a blocking grid call that reports its events (of type E) on ``call``.
Work = Callable[[Reporter[E]], None]


def relay(items: Iterator[T], call: Reporter[E], shape: Callable[[T], E]) -> None:
    """Emit ``shape(item)`` for each of ``items`` until the call is stopped
    (noticed at the next item); then close ``items`` if it is a generator, which
    ends its stream or watch on the tower (a job itself keeps running)."""
    try:
        for item in items:
            if call.stopped.is_set():
                return
            call.emit(shape(item))
    finally:
        if isinstance(items, Generator):
            items.close()


@dataclass
class _End:
    """The last item of a call: ``error`` is what its work raised (None: it returned)."""
    error: BaseException | None


class Stopped(Exception):
    """The client went away before the call ended."""


class Call(Generic[E]):
    """``work(call)`` on its own thread, started at once (inside the event loop).

    ``work`` reports with ``call.emit(event)``, checks ``call.stopped`` (a
    threading.Event) between steps and registers ``call.on_stop(fn)`` for what
    must happen when the client leaves (e.g. a stream's cancel(), which also
    wakes a thread blocked on that stream). Read the events with ``async for
    event in call.events(gone)``; an exception from ``work`` is raised there,
    ``Stopped`` when ``gone`` (an asyncio.Event) is set first. Leaving that loop
    early stops the call."""

    def __init__(self, work: Work[E], name: str = "rngrid-gateway-call") -> None:
        self.stopped = threading.Event()
        self._work = work
        self._stoppers: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._loop = asyncio.get_running_loop()
        self._items: deque[E | _End] = deque()  # in order; touched only on the event loop's thread
        self._ready = asyncio.Event()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def emit(self, event: E) -> None:
        self._put(event)

    def on_stop(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` when the call is stopped (at once when it already is)."""
        with self._lock:
            if not self.stopped.is_set():
                self._stoppers.append(fn)
                return
        fn()

    def stop(self) -> None:
        """Stop the call (idempotent): run what was registered with on_stop."""
        with self._lock:
            if self.stopped.is_set():
                return
            self.stopped.set()
            stoppers, self._stoppers = self._stoppers, []
        for fn in stoppers:
            try:
                fn()
            except Exception:
                log.exception("stopping a grid call failed")

    async def events(self, gone: asyncio.Event) -> AsyncGenerator[E, None]:
        try:
            while True:
                item = await self._next(gone)
                if isinstance(item, _End):
                    if item.error is not None:
                        raise item.error
                    return
                # A str event is a Text; the joined one is a Text too, so still an E.
                yield cast(E, self._joined(item)) if isinstance(item, str) else item
        finally:
            self.stop()

    def _joined(self, text: str) -> str:
        """``text`` and the text pieces already waiting after it, as one Text
        (their logprobs joined too): when the reader falls behind (a busy
        machine), fewer and larger chunks catch up."""
        if not (self._items and isinstance(self._items[0], str)):
            return text
        parts = [text]
        while self._items and isinstance(self._items[0], str):
            parts.append(cast(str, self._items.popleft()))  # the loop's test: a str
        joined = Text("".join(parts))
        joined.logprobs = [lp for part in parts for lp in getattr(part, "logprobs", ())]
        return joined

    async def _next(self, gone: asyncio.Event) -> E | _End:
        while True:
            if gone.is_set():  # the client left: what is still queued is for nobody
                raise Stopped()
            if self._items:
                return self._items.popleft()
            self._ready.clear()
            ready, left = asyncio.ensure_future(self._ready.wait()), asyncio.ensure_future(gone.wait())
            try:
                await asyncio.wait({ready, left}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ready.cancel()
                left.cancel()

    def _push(self, item: E | _End) -> None:
        self._items.append(item)
        self._ready.set()

    def _put(self, item: E | _End) -> None:
        try:
            self._loop.call_soon_threadsafe(self._push, item)
        except RuntimeError:  # the event loop is closed: the server has stopped
            self.stop()

    def _run(self) -> None:
        try:
            self._work(self)
        except BaseException as e:  # handed to the event loop, which answers with it
            self._put(_End(e))
        else:
            self._put(_End(None))
