"""Ollama's API on the grid: the routes under ``/api``, beside OpenAI's.

Point an Ollama client at the gateway (``OLLAMA_HOST=http://127.0.0.1:8080``).
The same Grid serves both sides: the same routing, failover, busy-wait, API
key, cancel (a client that leaves stops its generation on the tower) and
status codes; errors come as Ollama's ``{"error": message}`` plus the grid's
``code`` (errors.py). Request checks: ollama_api.py; reply shapes: ollama_reply.py.

- ``GET /api/version``: {"version": OLLAMA_VERSION}, the Ollama release whose
  API this follows, and ``rngrid``: this package's version.
- ``GET /api/tags``, ``POST /api/show``, ``GET /api/ps``: the models the live
  towers hold, what each is (capabilities too), and what runs where.
- ``POST /api/chat``, ``POST /api/generate``: NDJSON streams (or one object
  with ``stream: false``), ``tools`` and ``format``.
- ``POST /api/embed``, ``POST /api/embeddings``: vectors.
- ``POST /api/pull``: the grid's pull (the model into this gateway's own
  store, from every tower that has it), with Ollama's progress lines.
"""

import json
import time
import types
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from importlib import metadata
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from links.wire import Code, WireError
from reticulum_grid.client import Usage
from reticulum_grid.gateway import ollama_api, ollama_reply
from reticulum_grid.gateway.bridge import Reporter, Stopped, Work
from reticulum_grid.gateway.errors import ApiError, as_api_error, bad_request
from reticulum_grid.gateway.http import embedded, endpoint, json_body, start
from reticulum_grid.gateway.inference import Piece, ended, inference_work
from reticulum_grid.gateway.openai_reply import shortened
from reticulum_grid.gateway.parts import GatewayParts

#: The Ollama release whose API (docs/api.md, api/types.go) this gateway follows.
OLLAMA_VERSION = "0.12.0"
NDJSON = "application/x-ndjson"


async def _ndjson(objects: AsyncIterator[dict[str, Any]],
                  events: AsyncGenerator[Any, None]) -> AsyncGenerator[str, None]:
    """NDJSON lines of a stream's ``objects``; an error after the first line is
    one ``{"error": ...}`` line (what Ollama's clients raise), then the end.
    ``events``, the grid call the objects come from, is closed whatever happens."""
    try:
        async for obj in objects:
            yield json.dumps(obj) + "\n"
    except Stopped:
        return
    except Exception as e:
        yield json.dumps(as_api_error(e).ollama_body()) + "\n"
    finally:
        await events.aclose()


def _package_version() -> str:
    try:
        return metadata.version("reticulum-grid")
    except metadata.PackageNotFoundError:
        return "unknown"


class OllamaRoutes:
    def __init__(self, gateway: GatewayParts) -> None:
        self.gateway = gateway

    def routes(self) -> list[Route]:
        return [Route("/api/version", self.version), Route("/api/tags", self.tags), Route("/api/ps", self.ps),
                Route("/api/show", self.show, methods=["POST"]),
                self._post("/api/chat", self._generation, chat=True),
                self._post("/api/generate", self._generation, chat=False),
                self._post("/api/embed", self._embeddings, legacy=False),
                self._post("/api/embeddings", self._embeddings, legacy=True),
                Route("/api/pull", self.pull, methods=["POST"])]

    def _post(self, path: str, handler: Callable[..., Awaitable[Response]], **flag: bool) -> Route:
        """``POST path`` answered by ``handler(request, **flag)``: two routes
        that differ by one flag share one handler, failures in Ollama's shape."""
        async def answer(routes: "OllamaRoutes", request: Request) -> Response:
            return await handler(request, **flag)

        # Bound as a method: Starlette calls a function or a method with the request alone.
        return Route(path, types.MethodType(endpoint("ollama")(answer), self), methods=["POST"])

    @endpoint("ollama")
    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": OLLAMA_VERSION, "rngrid": _package_version()})

    def _heard_at(self) -> dict[str, float]:
        return {e.name: e.heard_at for e in self.gateway.grid.table.live()}

    @endpoint("ollama")
    async def tags(self, request: Request) -> Response:
        rows = await run_in_threadpool(self.gateway.views.tower_models)
        return JSONResponse(ollama_reply.tags(rows, self._heard_at()))

    @endpoint("ollama")
    async def ps(self, request: Request) -> Response:
        return JSONResponse(ollama_reply.ps(await run_in_threadpool(self.gateway.views.tower_models)))

    @endpoint("ollama")
    async def show(self, request: Request) -> Response:
        body = ollama_api.checked_object(await json_body(request), ollama_api.SHOW_FIELDS)
        name = ollama_api.model_name(body, self.gateway.views.model_aliases())
        rows = await run_in_threadpool(self.gateway.views.tower_models)
        shown = ollama_reply.show(name["model"], rows, self._heard_at(), name.get("adapter"))
        if shown is None:
            raise ApiError(404, f"model {name['model']!r} not found: no tower heard holds it",
                           code=Code.UNKNOWN_MODEL, param="model")
        return JSONResponse(shown)

    # -- generation ---------------------------------------------------------
    async def _generation(self, request: Request, chat: bool) -> Response:
        started, gateway = time.perf_counter(), self.gateway
        body = await json_body(request)
        parse = ollama_api.parse_chat if chat else ollama_api.parse_generate
        req = parse(body, gateway.views.model_aliases())
        reply = ollama_reply.Reply(chat, req.model, started, req.top_logprobs)
        if req.payload is None:  # Ollama's "load the model": the towers load what they are asked for
            gateway.check_known({"model": req.model.removesuffix(":latest")}, req.tower, model_code=Code.UNKNOWN_MODEL)
            return JSONResponse(reply.loaded())
        gateway.check_known(req.payload, req.tower, model_code=Code.UNKNOWN_MODEL)
        first, events = await start(request, inference_work(gateway.grid, req.payload, req.tower,
                                                            gateway.busy_wait_s))
        if req.stream:
            return StreamingResponse(_ndjson(self._objects(reply, first, events), events), media_type=NDJSON)
        pieces = [first]
        async for piece in events:
            pieces.append(piece)
        return JSONResponse(reply.whole(*ended(pieces)))

    @staticmethod
    async def _objects(reply: ollama_reply.Reply, piece: Piece,
                       events: AsyncGenerator[Piece, None]) -> AsyncGenerator[dict[str, Any], None]:
        """The reply objects of one stream, from its first ``piece`` and the rest."""
        while not isinstance(piece, Usage):
            for obj in reply.pieces(piece):
                yield obj
            piece = await anext(events)
        for obj in reply.last(piece):
            yield obj

    # -- embeddings ---------------------------------------------------------
    async def _embeddings(self, request: Request, legacy: bool) -> Response:
        started, gateway = time.perf_counter(), self.gateway
        body = await json_body(request)
        req = ollama_api.parse_embed(body, gateway.views.model_aliases(), legacy=legacy)
        gateway.check_known({"model": req.model}, req.tower, model_code=Code.UNKNOWN_MODEL)
        result = await embedded(request, gateway, req.model, req.texts, req.tower, req.dimensions)
        vectors = [shortened(v, req.dimensions) for v in result.vectors]
        if legacy:
            return JSONResponse({"embedding": vectors[0]})
        return JSONResponse(ollama_reply.embed(req.asked, result, vectors, started))

    # -- pull ---------------------------------------------------------------
    @endpoint("ollama")
    async def pull(self, request: Request) -> Response:
        body = ollama_api.checked_object(await json_body(request), ollama_api.PULL_FIELDS)
        name = ollama_api.model_name(body, self.gateway.views.model_aliases())
        if "adapter" in name:
            raise bad_request("pull a model by its name (an adapter is pulled by its own alias)", "model")
        first, events = await start(request, self._pull_work(name["model"]), name="rngrid-gateway-pull")
        if body.get("stream") is False:
            last = first
            async for event in events:
                last = event
            return JSONResponse(last)

        async def objects() -> AsyncGenerator[dict[str, Any], None]:
            yield first
            async for event in events:
                yield event

        return StreamingResponse(_ndjson(objects(), events), media_type=NDJSON)

    def _pull_work(self, model: str) -> Work[dict[str, Any]]:
        """``work(call)``: Grid.pull with Ollama's progress lines: "pulling
        manifest", "pulling <blob>" {digest, total, completed} (bytes), "verifying
        blake3 digest" (every chunk and the whole blob were checked), "success"."""
        grid = self.gateway.grid

        def work(call: Reporter[dict[str, Any]]) -> None:
            call.emit({"status": "pulling manifest"})
            holders = [e for e in grid.table.live() if e.caps.model(model)]
            blob = next((r.hex for r in grid.tower_models(holders) if r.alias == model), None) if holders else None
            status = f"pulling {blob[:12]}" if blob else f"pulling {model}"
            digest = {"digest": f"blake3:{blob}"} if blob else {}
            last = [0.0]

            def progress(done: int, total: int) -> None:
                now = time.monotonic()
                if now - last[0] >= 0.1 or done == total:  # a line per chunk would flood a slow reader
                    last[0] = now
                    call.emit({"status": status, **digest, "total": total, "completed": done})

            info, _ = grid.pull(model, progress=progress)
            if info is None:  # fetched and verified, then removed (rngrid models rm) before it could be read back
                raise WireError(Code.UNKNOWN_BLOB, f"{model} was fetched but is no longer in this gateway's store")
            call.emit({"status": "verifying blake3 digest", "digest": f"blake3:{info.hex}"})
            call.emit({"status": "success"})

        return work
