"""What an HTTP request must pass before and while the gateway reads its body.

A gateway bound beyond loopback faces callers without the key, so nothing a
caller sends is held before it has shown the key, and nothing is held for long:

- At most ``max_requests`` HTTP requests and WebSockets are served at once;
  the next is answered 503 with ``Retry-After`` (uvicorn's own
  ``limit_concurrency`` caps open connections above that, for those that never
  finish their headers).
- The API key is checked on the headers, before a byte of the body is read:
  401 (every route but the static dashboard files, which hold no data). A
  declared ``Content-Length`` over MAX_BODY_BYTES is 413 at once.
- The body must arrive within ``body_timeout_s`` seconds (408), and all bodies
  held at once stay under BODY_BUDGET_BYTES (503): a flood of slow uploads
  with the key holds at most that much.
- Each refusal closes the connection (``Connection: close``), so the rest of
  an unread body is never read.
- When the last request that held a large body ends, the C allocator is asked
  to give freed memory back to the system (memory.give_back).

Then ``DisconnectWatch``'s part: ``scope["rngrid.gone"]`` is an asyncio.Event
set when the client disconnects (or the response is done); the app's
``receive`` replays the body, then answers ``http.disconnect`` once that
happens, so work is cancelled on the tower at once when a client leaves.
WebSockets check their key themselves (websocket.py: a browser sends it in
its first message).
"""

import asyncio

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reticulum_grid.gateway.errors import ApiError, shape_for
from reticulum_grid.gateway.http import check_key, closing_response
from reticulum_grid.gateway.memory import give_back

#: Largest request body read (bytes): the tower takes at most 1 MiB of msgpack.
MAX_BODY_BYTES = 4 << 20
#: Seconds a request's body may take to arrive before the request is answered 408.
BODY_TIMEOUT_S = 30.0
#: HTTP requests and WebSockets served at once; more are answered 503.
MAX_REQUESTS = 256
#: Bytes of request bodies held at once, all requests together.
BODY_BUDGET_BYTES = 64 << 20
#: A body at least this large is followed by memory.give_back() once its request ends.
LARGE_BODY_BYTES = 1 << 20
#: Paths that need no key: the dashboard's page and its static files (no data in them).
OPEN_PATH, OPEN_PREFIX = "/", "/static/"
#: Seconds a refused caller is told to wait (Retry-After).
RETRY_AFTER_S = 1


class Intake:
    """ASGI middleware over the app. ``api_key``: None when none is needed;
    ``max_requests``, ``body_timeout_s``: see the module doc."""

    def __init__(self, app: ASGIApp, api_key: str | None = None, max_requests: int = MAX_REQUESTS,
                 body_timeout_s: float = BODY_TIMEOUT_S) -> None:
        self.app, self.api_key = app, api_key
        self.max_requests, self.body_timeout_s = max_requests, body_timeout_s
        self.active = 0  # requests and WebSockets being served (touched on the event loop only)
        self.held = 0  # bytes of bodies being held
        self.large = 0  # requests holding a body of LARGE_BODY_BYTES or more

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        if self.active >= self.max_requests:
            return await self._refuse(scope, receive, send, ApiError(
                503, f"the gateway serves {self.max_requests} requests at once; retry shortly",
                code="overloaded", retry_after=RETRY_AFTER_S))
        problem = self._refusal(scope) if scope["type"] == "http" else None
        if problem:
            return await self._refuse(scope, receive, send, problem)
        self.active += 1
        try:
            if scope["type"] == "websocket":
                return await self.app(scope, receive, send)
            await self._serve(scope, receive, send)
        finally:
            self.active -= 1

    def _refusal(self, scope: Scope) -> ApiError | None:
        """The ApiError (401, 413) that headers alone earn, else None."""
        path = scope["path"]
        if path != OPEN_PATH and not path.startswith(OPEN_PREFIX):
            try:
                check_key(self.api_key, Headers(scope=scope))
            except ApiError as e:
                return e
        length = Headers(scope=scope).get("content-length", "")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            return _too_large()
        return None

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = bytearray()
        try:
            problem = await self._read(receive, body)
            if isinstance(problem, _Gone):
                return
            if problem:
                return await self._refuse(scope, receive, send, problem)
            await _watching(self.app, scope, receive, send, body)
        finally:
            self.held -= len(body)
            if len(body) >= LARGE_BODY_BYTES:
                body.clear()
                self.large -= 1
                if not self.large:
                    give_back()

    async def _read(self, receive: Receive, body: bytearray) -> "ApiError | _Gone | None":
        """Read the request's body into ``body`` (a bytearray); None when it is
        whole, _GONE when the client left, else the ApiError to answer."""
        try:
            async with asyncio.timeout(self.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return _GONE
                    chunk = message.get("body", b"")
                    if len(body) + len(chunk) > MAX_BODY_BYTES:
                        return _too_large()
                    if self.held + len(chunk) > BODY_BUDGET_BYTES:
                        return ApiError(503, "the gateway holds too many request bodies at once; retry "
                                                   "shortly", code="overloaded", retry_after=RETRY_AFTER_S)
                    self.large += len(body) < LARGE_BODY_BYTES <= len(body) + len(chunk)
                    body += chunk
                    self.held += len(chunk)
                    if not message.get("more_body"):
                        return None
        except TimeoutError:
            return ApiError(408, f"the request body did not arrive within {self.body_timeout_s:g} s",
                                  code="request_timeout")

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, error: ApiError) -> None:
        """Answer ``error`` and close the connection (a WebSocket: refuse its handshake)."""
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1013, "reason": error.message[:120]})
        await closing_response(error, shape_for(scope["path"]))(scope, receive, send)


class _Gone:
    """_read's answer when the client left before its body was whole (_GONE)."""


_GONE = _Gone()


def _too_large() -> ApiError:
    return ApiError(413, f"request body over {MAX_BODY_BYTES} bytes", code="request_too_large")


async def _watching(app: ASGIApp, scope: Scope, receive: Receive, send: Send, body: bytearray) -> None:
    """Run ``app`` with ``body`` replayed to it, setting ``scope["rngrid.gone"]``
    when the client disconnects or the app ends."""
    gone = scope["rngrid.gone"] = asyncio.Event()
    replay: list[Message] = [{"type": "http.request", "body": bytes(body), "more_body": False}]

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    async def app_receive() -> Message:
        if replay:
            return replay.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    watcher = asyncio.ensure_future(watch())
    try:
        await app(scope, app_receive, send)
    finally:
        watcher.cancel()
        gone.set()
