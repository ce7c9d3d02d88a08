"""What every route of the gateway shares: the API key, errors in the caller's
API's shape, JSON bodies, and grid calls started from a request.

``endpoint(shape)`` wraps a route method: it answers any failure as ``shape``
says, "openai" or "ollama" (errors.py); the API key was checked before the
body was read (intake.py). ``start(request, work)`` runs a
blocking grid call (bridge.Call) for the request and returns its first event
and the rest; an error before the first event is raised there, so it keeps
its HTTP status.
"""

import functools
import hmac
import json
import logging
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from links.wire import WireError
from reticulum_grid.client import Embeddings
from reticulum_grid.gateway.bridge import Call, Stopped, Work
from reticulum_grid.gateway.errors import ApiError, as_api_error, bad_request
from reticulum_grid.gateway.inference import embeddings_work
from reticulum_grid.gateway.parts import GatewayParts

log = logging.getLogger("rngrid.gateway")

#: Deepest nesting of arrays and objects read (a tool's JSON schema needs a dozen levels).
MAX_JSON_DEPTH = 64
#: A UTF-16 surrogate left alone in a decoded string (json decodes escaped pairs into one character).
_SURROGATE = re.compile("[\ud800-\udfff]")
E = TypeVar("E")
#: The object a route method belongs to.
S = TypeVar("S")
#: A route method: (self, request) -> its response.
Handler = Callable[[S, Request], Awaitable[Response]]
#: A route method as endpoint() wraps it.
Wrapped = Callable[[S, Request], Coroutine[Any, Any, Response]]


def check_key(api_key: str | None, headers: Mapping[str, str]) -> None:
    """Raise ApiError(401) unless ``headers`` (a request's) carry ``Authorization: Bearer API_KEY`` (None: no key
    needed)."""
    if api_key is None:
        return
    header = headers.get("authorization", "")
    given = header[7:].strip() if header.lower().startswith("bearer ") else ""
    if not hmac.compare_digest(given.encode(), api_key.encode()):
        raise ApiError(401, "missing or wrong API key (send Authorization: Bearer KEY)", code="invalid_api_key")


def error_response(error: BaseException, shape: str = "openai") -> JSONResponse:
    """The JSONResponse for any exception, in OpenAI's or Ollama's shape."""
    api = as_api_error(error)
    if api.status >= 500 and not isinstance(error, (ApiError, WireError)):
        log.error("request failed", exc_info=error)
    body = api.ollama_body() if shape == "ollama" else api.body()
    return JSONResponse(body, status_code=api.status, headers=api.headers())


def closing_response(error: BaseException, shape: str = "openai") -> JSONResponse:
    """error_response() that also closes the connection: for a refusal answered
    before the request's body was read, so the rest of it never is."""
    response = error_response(error, shape)
    response.headers["connection"] = "close"
    return response


def endpoint(shape: str = "openai") -> Callable[[Handler[S]], Wrapped[S]]:
    """Route-method wrapper: every failure answered in ``shape``."""

    def wrap(handler: Handler[S]) -> Wrapped[S]:
        @functools.wraps(handler)
        async def wrapped(self: S, request: Request) -> Response:
            try:
                return await handler(self, request)
            except Stopped:
                return Response(status_code=499)  # the client is gone; nobody reads this
            except Exception as e:
                return error_response(e, shape)

        return wrapped

    return wrap


async def json_body(request: Request) -> object:
    """The request's JSON body (any JSON value: the caller checks its shape). Raises ApiError(400)."""
    raw = await request.body()
    if not raw.strip():
        raise bad_request("missing request body: send a JSON object")
    try:
        return parse_json(raw)
    except ValueError as e:
        raise bad_request(f"the request body is not JSON the grid takes: {e}") from None


def parse_json(raw: str | bytes) -> object:
    """The value of JSON text ``raw`` (str or UTF-8 bytes). Raises ValueError for
    what is not JSON, and for what JSON allows but no tower takes: nesting
    deeper than MAX_JSON_DEPTH (Python's parser gives up at about a thousand
    levels with RecursionError, msgpack at 512) and a lone UTF-16 surrogate
    (``"\\ud800"``: valid JSON, no UTF-8 string)."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        surrogate = _SURROGATE.search(item) if isinstance(item, str) else None
        if surrogate:
            raise ValueError(f"a string holds a lone UTF-16 surrogate ({surrogate.group()!a}), "
                             "which no UTF-8 text can")
        if isinstance(item, (dict, list)):
            if depth >= MAX_JSON_DEPTH:
                raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
            stack.extend((part, depth + 1) for part in (
                (*item.keys(), *item.values()) if isinstance(item, dict) else item))
    return value


async def start(request: Request, work: Work[E],
                name: str = "rngrid-gateway-call") -> tuple[E, AsyncGenerator[E, None]]:
    """(first event, async iterator of the rest) of ``work`` run for ``request``.
    Raises what the work raised before its first event; Stopped when the
    client left before it."""
    events = Call(work, name=name).events(request.scope["rngrid.gone"])
    try:
        first = await anext(events)
    except StopAsyncIteration:  # the work ended without a word: only when its client left
        raise Stopped() from None
    return first, events


async def embedded(request: Request, gateway: GatewayParts, model: str, texts: list[str], tower: str | None,
                   dimensions: int | None) -> Embeddings:
    """The client.Embeddings of ``texts`` by ``model`` for an HTTP request
    (OpenAI's and Ollama's routes alike). Raises ApiError(400) when
    ``dimensions`` asks for more than the model gives; WireError as the Grid does."""
    result, events = await start(request, embeddings_work(gateway.grid, model, texts, tower, gateway.busy_wait_s))
    await events.aclose()
    if dimensions is not None and dimensions > result.dims:
        raise bad_request(f"'dimensions' is {dimensions}, more than the {result.dims} of {model!r}", "dimensions")
    return result
