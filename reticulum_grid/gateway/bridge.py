"""Blocking Grid calls seen from asyncio, and client disconnects seen by them.

The Grid is synchronous (RNS threads, blocking Links), so each request's grid
work runs on a thread of its own (``Call``) and its events cross to the event
loop through an asyncio queue. ``DisconnectWatch`` (ASGI middleware) notices
a client that goes away (closed socket, aborted fetch) even while nothing is
being sent, so that work can be cancelled on the tower at once.
"""

import asyncio
import json
import logging
import threading
from collections import deque

from reticulum_grid.client import Text

log = logging.getLogger("rngrid.gateway")

#: Largest request body read (bytes): the tower takes at most 1 MiB of msgpack.
MAX_BODY_BYTES = 4 << 20
_END = object()


class Stopped(Exception):
    """The client went away before the call ended."""


class Call:
    """``work(call)`` on its own thread, started at once (inside the event loop).

    ``work`` reports with ``call.emit(event)``, checks ``call.stopped`` (a
    threading.Event) between steps and registers ``call.on_stop(fn)`` for what
    must happen when the client leaves (e.g. a stream's cancel(), which also
    wakes a thread blocked on that stream). Read the events with ``async for
    event in call.events(gone)``; an exception from ``work`` is raised there,
    ``Stopped`` when ``gone`` (an asyncio.Event) is set first. Leaving that loop
    early stops the call."""

    def __init__(self, work, name="rngrid-gateway-call"):
        self.stopped = threading.Event()
        self._work = work
        self._stoppers = []
        self._lock = threading.Lock()
        self._loop = asyncio.get_running_loop()
        self._items = deque()  # (event, error) in order; touched only on the event loop's thread
        self._ready = asyncio.Event()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def emit(self, event):
        self._put((event, None))

    def on_stop(self, fn):
        """Run ``fn()`` when the call is stopped (at once when it already is)."""
        with self._lock:
            if not self.stopped.is_set():
                self._stoppers.append(fn)
                return
        fn()

    def stop(self):
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

    async def events(self, gone):
        try:
            while True:
                event, error = await self._next(gone)
                if event is _END:
                    if error is not None:
                        raise error
                    return
                yield self._joined(event) if isinstance(event, str) else event
        finally:
            self.stop()

    def _joined(self, text):
        """``text`` and the text pieces already waiting after it, as one Text
        (their logprobs joined too): when the reader falls behind (a busy
        machine), fewer and larger chunks catch up."""
        if not (self._items and isinstance(self._items[0][0], str)):
            return text
        parts = [text]
        while self._items and isinstance(self._items[0][0], str):
            parts.append(self._items.popleft()[0])
        joined = Text("".join(parts))
        joined.logprobs = [lp for part in parts for lp in getattr(part, "logprobs", ())]
        return joined

    async def _next(self, gone):
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

    def _push(self, item):
        self._items.append(item)
        self._ready.set()

    def _put(self, item):
        try:
            self._loop.call_soon_threadsafe(self._push, item)
        except RuntimeError:  # the event loop is closed: the server has stopped
            self.stop()

    def _run(self):
        try:
            self._work(self)
        except BaseException as e:  # handed to the event loop, which answers with it
            self._put((_END, e))
        else:
            self._put((_END, None))


class DisconnectWatch:
    """ASGI middleware: reads each HTTP request's body (at most MAX_BODY_BYTES,
    else 413), then watches the connection. ``scope["rngrid.gone"]`` is an
    asyncio.Event set when the client disconnects (or the response is done);
    the app's ``receive`` replays the body, then answers ``http.disconnect``
    once that happens."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        gone = scope["rngrid.gone"] = asyncio.Event()
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            if size > MAX_BODY_BYTES:
                return await _too_large(send)
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def watch():
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        async def app_receive():
            if replay:
                return replay.pop()
            await gone.wait()
            return {"type": "http.disconnect"}

        watcher = asyncio.ensure_future(watch())
        try:
            await self.app(scope, app_receive, send)
        finally:
            watcher.cancel()
            gone.set()


async def _too_large(send):
    body = json.dumps({"error": {"message": f"request body over {MAX_BODY_BYTES} bytes",
                                 "type": "invalid_request_error", "param": None,
                                 "code": "request_too_large"}}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
