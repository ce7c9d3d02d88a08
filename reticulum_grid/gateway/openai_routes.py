"""OpenAI's API on the grid: the routes under ``/v1``.

- ``POST /v1/chat/completions``, ``POST /v1/completions``: streamed (SSE,
  ``data: [DONE]``) or not; what is accepted is in openai_api.py, the reply
  shapes in openai_reply.py. An error after the first chunk is one SSE
  ``error`` event, then the stream closes.
- ``POST /v1/embeddings``: OpenAI's request and response (``encoding_format``
  float or base64, ``dimensions``).
- ``GET /v1/models``: every model and adapter a live tower holds (OpenAI's
  shape, plus ``rngrid`` = {kind, blob, towers}); ``GET /v1/models/{id}``.
"""

import json
from collections.abc import AsyncGenerator
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reticulum_grid.client import Usage
from reticulum_grid.gateway import openai_api, openai_reply
from reticulum_grid.gateway.bridge import Stopped
from reticulum_grid.gateway.errors import ApiError, as_api_error
from reticulum_grid.gateway.http import embedded, endpoint, json_body, start
from reticulum_grid.gateway.inference import Piece, ended, inference_work
from reticulum_grid.gateway.parts import GatewayParts

#: Seconds between SSE comment pings on a quiet stream (keeps proxies from closing it).
PING_S = 15


class OpenAIRoutes:
    def __init__(self, gateway: GatewayParts) -> None:
        self.gateway = gateway

    def routes(self) -> list[Route]:
        return [Route("/v1/models", self.models), Route("/v1/models/{model:path}", self.model),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/embeddings", self.embeddings, methods=["POST"])]

    @endpoint()
    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": await run_in_threadpool(self.gateway.views.models)})

    @endpoint()
    async def model(self, request: Request) -> Response:
        name = request.path_params["model"]
        for row in await run_in_threadpool(self.gateway.views.models):
            if row["id"] == name:
                return JSONResponse(row)
        raise ApiError(404, f"no tower heard holds model {name!r}", code="model_not_found", param="model")

    @endpoint()
    async def chat(self, request: Request) -> Response:
        return await self._completion(request, chat=True)

    @endpoint()
    async def completions(self, request: Request) -> Response:
        return await self._completion(request, chat=False)

    async def _completion(self, request: Request, chat: bool) -> Response:
        gateway = self.gateway
        req = openai_api.parse(await json_body(request), chat, gateway.views.model_aliases())
        gateway.check_known(req.payload, req.tower)
        first, events = await start(request, inference_work(gateway.grid, req.payload, req.tower,
                                                            gateway.busy_wait_s))
        reply = openai_reply.Reply(chat, req.model, req.top_logprobs)
        if req.stream:
            return EventSourceResponse(self._chunks(reply, first, events, req.include_usage), ping=PING_S)
        pieces = [first]
        async for piece in events:
            pieces.append(piece)
        return JSONResponse(reply.complete(*ended(pieces)))

    async def _chunks(self, reply: openai_reply.Reply, piece: Piece, events: AsyncGenerator[Piece, None],
                      include_usage: bool) -> AsyncGenerator[dict[str, str], None]:
        """SSE data for one stream; an error after the first piece is one error event."""
        try:
            if reply.chat:
                yield _data(reply.chunk(first=True))
            while not isinstance(piece, Usage):
                yield _data(reply.chunk(piece))
                piece = await anext(events)
            yield _data(reply.chunk(finish_reason=openai_reply.finish_reason(piece)))
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

    @endpoint()
    async def embeddings(self, request: Request) -> Response:
        gateway = self.gateway
        req = openai_api.parse_embeddings(await json_body(request), gateway.views.model_aliases())
        gateway.check_known({"model": req.model}, req.tower)
        result = await embedded(request, gateway, req.model, req.texts, req.tower, req.dimensions)
        return JSONResponse(openai_reply.embeddings(req, result))


def _data(obj: dict[str, Any]) -> dict[str, str]:
    return {"data": json.dumps(obj)}
