"""OpenAI's Responses API on the grid: the routes under ``/v1/responses``.

- ``POST /v1/responses``: a Response object, or with ``stream`` its typed SSE
  events (``event: TYPE`` and ``data: {"type": TYPE, ...}``, no ``[DONE]``,
  as OpenAI sends them); what is accepted is in responses_api.py, the shapes
  in responses_reply.py. It runs on the chat path: the same ``ai/inference``
  payload, routing, failover and busy wait as ``/v1/chat/completions``.
- ``GET`` / ``DELETE /v1/responses/{id}``: a kept response (responses_store.py),
  or its removal (``{"id", "object": "response", "deleted": true}``).
"""

import json
from collections.abc import AsyncGenerator

from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reticulum_grid.client import Usage
from reticulum_grid.gateway import responses_api
from reticulum_grid.gateway.bridge import Stopped
from reticulum_grid.gateway.errors import as_api_error
from reticulum_grid.gateway.http import endpoint, json_body, start
from reticulum_grid.gateway.inference import Piece, ended, inference_work
from reticulum_grid.gateway.openai_routes import PING_S
from reticulum_grid.gateway.parts import GatewayParts
from reticulum_grid.gateway.responses_reply import Item, Turn
from reticulum_grid.gateway.responses_store import ResponseStore


class ResponsesRoutes:
    def __init__(self, gateway: GatewayParts, store: ResponseStore | None = None) -> None:
        self.gateway = gateway
        self.store = store or ResponseStore()

    def routes(self) -> list[Route]:
        return [Route("/v1/responses", self.create, methods=["POST"]),
                Route("/v1/responses/{response_id}", self.kept, methods=["GET", "DELETE"])]

    @endpoint()
    async def kept(self, request: Request) -> Response:
        response_id = request.path_params["response_id"]
        if request.method == "DELETE":
            self.store.delete(response_id)
            return JSONResponse({"id": response_id, "object": "response", "deleted": True})
        return JSONResponse(self.store.get(response_id))

    @endpoint()
    async def create(self, request: Request) -> Response:
        gateway = self.gateway
        req = responses_api.parse(await json_body(request), gateway.views.model_aliases())
        history = self.store.history(req.previous_id) if req.previous_id else []
        payload = {**req.payload, "messages": req.messages(history)}
        gateway.check_known(payload, req.tower)
        first, events = await start(request, inference_work(gateway.grid, payload, req.tower, gateway.busy_wait_s))
        turn = Turn(req)
        if req.stream:
            return EventSourceResponse(self._events(req, turn, first, events), ping=PING_S)
        turn.start()
        pieces = [first]
        async for piece in events:
            pieces.append(piece)
        text, usage = ended(pieces)
        for piece in text:
            turn.add(piece)
        turn.finish(usage)
        self._keep(req, turn)
        return JSONResponse(turn.response())

    async def _events(self, req: responses_api.Request, turn: Turn, piece: Piece,
                      events: AsyncGenerator[Piece, None]) -> AsyncGenerator[dict[str, str], None]:
        """SSE events of one streamed response; a failure after the first piece
        is an ``error`` event, then ``response.failed``."""
        try:
            for event in turn.start():
                yield _sse(event)
            while not isinstance(piece, Usage):
                for event in turn.add(piece):
                    yield _sse(event)
                piece = await anext(events)
            for event in turn.finish(piece):
                yield _sse(event)
            self._keep(req, turn)
        except Stopped:
            return
        except Exception as e:
            for event in turn.fail(as_api_error(e)):
                yield _sse(event)
        finally:
            await events.aclose()

    def _keep(self, req: responses_api.Request, turn: Turn) -> None:
        if req.store:
            self.store.put(turn.response(), req.previous_id, req.turn + turn.output_messages())


def _sse(event: Item) -> dict[str, str]:
    return {"event": event["type"], "data": json.dumps(event)}
