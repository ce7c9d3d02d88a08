"""The gateway's HTTP app (Starlette): the route table, and the grid's own routes.

Routes (errors in the caller's API's shape, see errors.py):

- OpenAI's (openai_routes.py): ``POST /v1/chat/completions``,
  ``/v1/completions``, ``/v1/embeddings``; ``GET /v1/models``, ``/v1/models/{id}``;
  its Responses API (responses_routes.py): ``POST /v1/responses``, ``GET`` and
  ``DELETE /v1/responses/{id}``; its audio API (audio.py): ``POST
  /v1/audio/transcriptions``, ``/v1/audio/speech``.
- Ollama's (ollama_routes.py): ``GET /api/version``, ``/api/tags``, ``/api/ps``;
  ``POST /api/show``, ``/api/chat``, ``/api/generate``, ``/api/embed``,
  ``/api/embeddings``, ``/api/pull``.
- The grid's: ``GET /v1/grid/towers`` (the towers heard, with live load,
  views.py), ``GET /v1/grid/jobs`` (this identity's training jobs), ``POST
  /v1/grid/execute`` (any grid command, its events as NDJSON or SSE,
  commands.py), ``/v1/grid/ws`` (the same commands over a WebSocket, several
  at once, websocket.py), ``GET /health`` ({"status": "ok", "identity", "towers"}).
- ``GET /``: the dashboard page (static files, no build step).

Any other path or method is answered 404/405 with a message naming it. With
an API key, every route but the static page (which holds no data) needs
``Authorization: Bearer KEY``. What web pages may do is in guard.py.
"""

import json
from collections.abc import AsyncGenerator, Iterable, Mapping
from pathlib import Path
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from links.wire import Code
from reticulum_grid.client import Grid
from reticulum_grid.gateway import audio, commands, websocket
from reticulum_grid.gateway.bridge import Call, Stopped
from reticulum_grid.gateway.errors import ApiError, as_api_error, bad_request, shape_for
from reticulum_grid.gateway.guard import BrowserGuard
from reticulum_grid.gateway.http import endpoint, error_response, json_body
from reticulum_grid.gateway.inference import Event
from reticulum_grid.gateway.intake import BODY_TIMEOUT_S, MAX_REQUESTS, Intake
from reticulum_grid.gateway.ollama_routes import OllamaRoutes
from reticulum_grid.gateway.openai_routes import OpenAIRoutes
from reticulum_grid.gateway.responses_routes import ResponsesRoutes
from reticulum_grid.gateway.views import Views

STATIC = Path(__file__).parent / "static"
#: Seconds a request waits while every tower is busy before it is answered 429.
BUSY_WAIT_S = 30.0
#: Seconds between SSE comment pings on a quiet stream (keeps proxies from closing it).
PING_S = 15


class Gateway:
    """``grid``: a reticulum_grid.client.Grid; ``api_key``: required on every
    request when set; ``busy_wait_s``: how long a request waits while every
    tower is busy; ``max_requests``, ``body_timeout_s``: intake.py's limits."""

    def __init__(self, grid: Grid, api_key: str | None = None, busy_wait_s: float = BUSY_WAIT_S,
                 origins: Iterable[str] = (), loopback: bool = True, max_requests: int = MAX_REQUESTS,
                 body_timeout_s: float = BODY_TIMEOUT_S) -> None:
        self.grid = grid
        self.api_key = api_key
        self.busy_wait_s = busy_wait_s
        self.max_requests, self.body_timeout_s = max_requests, body_timeout_s
        self.origins, self.loopback = tuple(origins), loopback
        self.views = Views(grid)

    def app(self) -> Starlette:
        routes: list[BaseRoute] = [
            Route("/", lambda request: FileResponse(STATIC / "index.html")),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
            Route("/health", self.health),
            Route("/v1/grid/towers", self.towers),
            Route("/v1/grid/jobs", self.jobs),
            Route("/v1/grid/execute", self.execute, methods=["POST"]),
            websocket.route(self),
            *OpenAIRoutes(self).routes(),
            *ResponsesRoutes(self).routes(),
            *OllamaRoutes(self).routes(),
            *audio.routes(self),
        ]
        middleware = [Middleware(BrowserGuard, origins=self.origins, loopback=self.loopback),
                      Middleware(Intake, api_key=self.api_key, max_requests=self.max_requests,
                                 body_timeout_s=self.body_timeout_s)]
        return Starlette(routes=routes, middleware=middleware,
                         exception_handlers={HTTPException: self._http_error, Exception: self._crash})

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        """404 and 405 naming what was asked, in the shape of the API the path belongs to.
        Registered for HTTPException (Starlette's handler type takes any Exception)."""
        if not isinstance(exc, HTTPException):
            return await self._crash(request, exc)
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            error = ApiError(404, f"no such endpoint: {where}; this gateway serves OpenAI's API under /v1 "
                                  "(chat/completions, completions, responses, embeddings, models, audio), Ollama's "
                                  "under /api (version, tags, show, ps, chat, generate, embed, embeddings, pull) and "
                                  "the grid's under /v1/grid", code="not_found", param=request.url.path)
        elif exc.status_code == 405:
            error = ApiError(405, f"{where} is not allowed here (another method is)", code="method_not_allowed",
                             param=request.method)
        else:
            error = ApiError(exc.status_code, str(exc.detail), code="bad_request")
        return error_response(error, shape_for(request.url.path))

    async def _crash(self, request: Request, exc: Exception) -> Response:
        return error_response(exc, shape_for(request.url.path))

    def check_known(self, payload: Mapping[str, Any], tower: str | None, model_code: str = "model_not_found",
                    param: str = "model") -> None:
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

    # -- the grid's views ---------------------------------------------------
    @endpoint()
    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "identity": self.grid.identity_hash,
                             "towers": len(self.grid.table.live())})

    @endpoint()
    async def towers(self, request: Request) -> Response:
        return JSONResponse({"towers": await run_in_threadpool(self.views.towers)})

    @endpoint()
    async def jobs(self, request: Request) -> Response:
        return JSONResponse({"jobs": await run_in_threadpool(self.views.jobs)})

    # -- the grid's commands ------------------------------------------------
    @endpoint()
    async def execute(self, request: Request) -> Response:
        body = await json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("command"), str):
            raise bad_request("the body must be {\"command\": str, \"params\": {...}}", "command")
        params = body.get("params", {})
        work = commands.work_for(self.grid, self.views, body["command"], params, self.busy_wait_s)
        if body["command"] in ("ai/inference", "ai/embeddings"):
            self.check_known(params, params.get("tower"), model_code=Code.UNKNOWN_MODEL, param="params.model")
        events = Call(work, name=f"rngrid-gateway-{body['command']}").events(request.scope["rngrid.gone"])
        try:
            first = await anext(events)
        except StopAsyncIteration:
            first = None
        lines = self._command_events(first, events)
        if "text/event-stream" in request.headers.get("accept", ""):
            return EventSourceResponse(({"data": json.dumps(event)} async for event in lines), ping=PING_S)
        return StreamingResponse((json.dumps(event) + "\n" async for event in lines),
                                 media_type="application/x-ndjson")

    @staticmethod
    async def _command_events(first: Event | None,
                              events: AsyncGenerator[Event, None]) -> AsyncGenerator[Event, None]:
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
