"""The gateway's HTTP app (Starlette): OpenAI's API, the grid's own API, the dashboard.

Routes (all JSON; errors in OpenAI's shape, see errors.py):

- ``POST /v1/chat/completions``, ``POST /v1/completions``: OpenAI's, streamed
  (SSE, ``data: [DONE]``) or not; see openai_api.py for what is accepted.
- ``POST /v1/audio/transcriptions``, ``POST /v1/audio/speech``: OpenAI's audio API (audio.py).
- ``GET /v1/models``: every model and adapter a live tower holds (openai_api
  shape, plus ``rngrid`` = {kind, blob, towers}).
- ``GET /v1/grid/towers``: the towers heard, with live load (views.py).
- ``GET /v1/grid/jobs``: this identity's training jobs on every tower.
- ``POST /v1/grid/execute``: any grid command, its events as NDJSON or SSE (commands.py).
- ``GET /health``: {"status": "ok", "identity", "towers"}.
- ``GET /``: the dashboard page (static files, no build step).

With an API key, every route but the static page (which holds no data) needs
``Authorization: Bearer KEY``. What web pages may do is in guard.py.
"""

import hmac
import json
import logging
from pathlib import Path

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from links.wire import Code, WireError
from reticulum_grid.client import Usage
from reticulum_grid.gateway import audio, commands, openai_api
from reticulum_grid.gateway.bridge import Call, DisconnectWatch, Stopped
from reticulum_grid.gateway.errors import ApiError, as_api_error, bad_request
from reticulum_grid.gateway.guard import BrowserGuard
from reticulum_grid.gateway.inference import inference_work
from reticulum_grid.gateway.views import Views

log = logging.getLogger("rngrid.gateway")
STATIC = Path(__file__).parent / "static"
#: Seconds a request waits while every tower is busy before it is answered 429.
BUSY_WAIT_S = 30.0
#: Seconds between SSE comment pings on a quiet stream (keeps proxies from closing it).
PING_S = 15


def _api(handler):
    """Route wrapper: API key check, every failure answered in OpenAI's error shape."""

    async def wrapped(self, request):
        try:
            self.check_key(request)
            return await handler(self, request)
        except Stopped:
            return Response(status_code=499)  # the client is gone; nobody reads this
        except Exception as e:
            return self.error_response(e)

    return wrapped


class Gateway:
    """``grid``: a reticulum_grid.client.Grid; ``api_key``: required on every
    request when set; ``busy_wait_s``: how long a request waits while every
    tower is busy."""

    def __init__(self, grid, api_key=None, busy_wait_s=BUSY_WAIT_S, origins=(), loopback=True):
        self.grid = grid
        self.api_key = api_key
        self.busy_wait_s = busy_wait_s
        self.origins, self.loopback = tuple(origins), loopback
        self.views = Views(grid)

    def app(self):
        routes = [
            Route("/", lambda request: FileResponse(STATIC / "index.html")),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
            Route("/health", self.health),
            Route("/v1/models", self.models),
            Route("/v1/models/{model:path}", self.model),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/grid/towers", self.towers),
            Route("/v1/grid/jobs", self.jobs),
            Route("/v1/grid/execute", self.execute, methods=["POST"]),
            *audio.routes(self, _api),
        ]
        middleware = [Middleware(BrowserGuard, origins=self.origins, loopback=self.loopback),
                      Middleware(DisconnectWatch)]
        return Starlette(routes=routes, middleware=middleware,
                         exception_handlers={HTTPException: self._http_error, Exception: self._crash})

    # -- plumbing ---------------------------------------------------------
    def check_key(self, request):
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        given = header[7:].strip() if header.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            raise ApiError(401, "missing or wrong API key (send Authorization: Bearer KEY)", code="invalid_api_key")

    def error_response(self, error):
        api = as_api_error(error)
        if api.status >= 500 and not isinstance(error, (ApiError, WireError)):
            log.error("request failed", exc_info=error)
        return JSONResponse(api.body(), status_code=api.status, headers=api.headers())

    async def _http_error(self, request, exc):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "bad_request")
        return JSONResponse(ApiError(exc.status_code, exc.detail, code=code).body(), status_code=exc.status_code)

    async def _crash(self, request, exc):
        return self.error_response(exc)

    @staticmethod
    async def _json(request):
        try:
            return json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as e:
            raise bad_request(f"the request body is not JSON: {e}") from None

    # -- the grid's views ---------------------------------------------------
    @_api
    async def health(self, request):
        return JSONResponse({"status": "ok", "identity": self.grid.identity_hash,
                             "towers": len(self.grid.table.live())})

    @_api
    async def models(self, request):
        return JSONResponse({"object": "list", "data": await run_in_threadpool(self.views.models)})

    @_api
    async def model(self, request):
        name = request.path_params["model"]
        for row in await run_in_threadpool(self.views.models):
            if row["id"] == name:
                return JSONResponse(row)
        raise ApiError(404, f"no tower heard holds model {name!r}", code="model_not_found", param="model")

    @_api
    async def towers(self, request):
        return JSONResponse({"towers": await run_in_threadpool(self.views.towers)})

    @_api
    async def jobs(self, request):
        return JSONResponse({"jobs": await run_in_threadpool(self.views.jobs)})

    # -- OpenAI completions -------------------------------------------------
    @_api
    async def chat(self, request):
        return await self._completion(request, chat=True)

    @_api
    async def completions(self, request):
        return await self._completion(request, chat=False)

    async def _completion(self, request, chat):
        req = openai_api.parse(await self._json(request), chat, self.views.model_aliases())
        self._check_known(req.payload, req.tower)
        call = Call(inference_work(self.grid, req.payload, req.tower, self.busy_wait_s))
        events = call.events(request.scope["rngrid.gone"])
        try:
            first = await anext(events)  # errors before any output keep their HTTP status
        except StopAsyncIteration:  # the work ended without a word: only when its client left
            raise Stopped() from None
        reply = openai_api.Reply(chat, req.model)
        if req.stream:
            return EventSourceResponse(self._chunks(reply, first, events, req.include_usage), ping=PING_S)
        pieces = [first]
        async for piece in events:
            pieces.append(piece)
        return JSONResponse(reply.complete("".join(pieces[:-1]), pieces[-1]))

    async def _chunks(self, reply, piece, events, include_usage):
        """SSE data for one stream; an error after the first piece is one error event."""
        try:
            if reply.chat:
                yield _data(reply.chunk(first=True))
            while not isinstance(piece, Usage):
                yield _data(reply.chunk(piece))
                piece = await anext(events)
            yield _data(reply.chunk(finish_reason=openai_api.finish_reason(piece)))
            if include_usage:
                yield _data(reply.usage_chunk(piece))
            yield {"data": "[DONE]"}
        except Stopped:
            return
        except Exception as e:
            api = as_api_error(e)
            yield {"event": "error", "data": json.dumps(api.body())}
        finally:
            await events.aclose()

    def _check_known(self, payload, tower, model_code="model_not_found", param="model"):
        """Answer 404 at once for a model or adapter no live tower holds (the Grid
        would wait for discovery first). Silent when nothing was heard yet, a
        tower is named, the caps were cut short, or this client could send it."""
        live = self.grid.table.live()
        if tower or not live or any(e.caps.more for e in live) or not isinstance(payload.get("model"), str):
            return
        model, adapter = payload["model"], payload.get("adapter")
        if not any(e.caps.model(model) for e in live) and self.grid.local_blob(model) is None:
            heard = sorted(self.views.model_aliases())
            raise ApiError(404, f"no tower heard has model {model!r}; the grid serves: {', '.join(heard)}",
                           code=model_code, param=param)
        if isinstance(adapter, str) and not any(e.caps.adapter(adapter) for e in live) \
                and self.grid.local_blob(adapter) is None:
            raise ApiError(404, f"no tower heard has adapter {adapter!r}", code=Code.UNKNOWN_ADAPTER, param=param)

    # -- the grid's commands ------------------------------------------------
    @_api
    async def execute(self, request):
        body = await self._json(request)
        if not isinstance(body, dict) or not isinstance(body.get("command"), str):
            raise bad_request("the body must be {\"command\": str, \"params\": {...}}", "command")
        params = body.get("params", {})
        work = commands.work_for(self.grid, self.views, body["command"], params, self.busy_wait_s)
        if body["command"] == "ai/inference":
            self._check_known(params, params.get("tower"), model_code=Code.UNKNOWN_MODEL, param="params.model")
        events = Call(work, name=f"rngrid-gateway-{body['command']}").events(request.scope["rngrid.gone"])
        try:
            first = await anext(events)
        except StopAsyncIteration:
            first = None
        lines = self._command_events(first, events)
        if "text/event-stream" in request.headers.get("accept", ""):
            return EventSourceResponse((_data(event) async for event in lines), ping=PING_S)
        return StreamingResponse((json.dumps(event) + "\n" async for event in lines),
                                 media_type="application/x-ndjson")

    @staticmethod
    async def _command_events(first, events):
        try:
            if first is None:
                return
            yield first
            async for event in events:
                yield event
        except Stopped:
            return
        except Exception as e:
            api = as_api_error(e)
            yield {"type": "error", "code": api.code, "message": api.message, "retry_after": api.retry_after}
        finally:
            await events.aclose()


def _data(obj):
    return {"data": json.dumps(obj)}
