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

from starlette.responses import JSONResponse, Response

from links.wire import WireError
from reticulum_grid.gateway.bridge import Call, Stopped
from reticulum_grid.gateway.errors import ApiError, as_api_error, bad_request
from reticulum_grid.gateway.inference import embeddings_work

log = logging.getLogger("rngrid.gateway")

#: Deepest nesting of arrays and objects read (a tool's JSON schema needs a dozen levels).
MAX_JSON_DEPTH = 64
#: A UTF-16 surrogate left alone in a decoded string (json decodes escaped pairs into one character).
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_key(api_key, headers):
    """Raise ApiError(401) unless ``headers`` (a request's) carry ``Authorization: Bearer API_KEY`` (None: no key
    needed)."""
    if api_key is None:
        return
    header = headers.get("authorization", "")
    given = header[7:].strip() if header.lower().startswith("bearer ") else ""
    if not hmac.compare_digest(given.encode(), api_key.encode()):
        raise ApiError(401, "missing or wrong API key (send Authorization: Bearer KEY)", code="invalid_api_key")


def error_response(error, shape="openai"):
    """The JSONResponse for any exception, in OpenAI's or Ollama's shape."""
    api = as_api_error(error)
    if api.status >= 500 and not isinstance(error, (ApiError, WireError)):
        log.error("request failed", exc_info=error)
    body = api.ollama_body() if shape == "ollama" else api.body()
    return JSONResponse(body, status_code=api.status, headers=api.headers())


def closing_response(error, shape="openai"):
    """error_response() that also closes the connection: for a refusal answered
    before the request's body was read, so the rest of it never is."""
    response = error_response(error, shape)
    response.headers["connection"] = "close"
    return response


def endpoint(shape="openai"):
    """Route-method wrapper: every failure answered in ``shape``."""

    def wrap(handler):
        @functools.wraps(handler)
        async def wrapped(self, request):
            try:
                return await handler(self, request)
            except Stopped:
                return Response(status_code=499)  # the client is gone; nobody reads this
            except Exception as e:
                return error_response(e, shape)

        return wrapped

    return wrap


async def json_body(request, empty=None):
    """The request's JSON body; ``empty`` (when not None) for an empty body. Raises ApiError(400)."""
    raw = await request.body()
    if not raw.strip():
        if empty is not None:
            return empty
        raise bad_request("missing request body: send a JSON object")
    try:
        return parse_json(raw)
    except ValueError as e:
        raise bad_request(f"the request body is not JSON the grid takes: {e}") from None


def parse_json(raw):
    """The value of JSON text ``raw`` (str or UTF-8 bytes). Raises ValueError for
    what is not JSON, and for what JSON allows but no tower takes: nesting
    deeper than MAX_JSON_DEPTH (Python's parser gives up at about a thousand
    levels with RecursionError, msgpack at 512) and a lone UTF-16 surrogate
    (``"\\ud800"``: valid JSON, no UTF-8 string)."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str) and _SURROGATE.search(item):
            raise ValueError(f"a string holds a lone UTF-16 surrogate ({_SURROGATE.search(item).group()!a}), "
                             "which no UTF-8 text can")
        if isinstance(item, (dict, list)):
            if depth >= MAX_JSON_DEPTH:
                raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
            stack.extend((part, depth + 1) for part in (
                (*item.keys(), *item.values()) if isinstance(item, dict) else item))
    return value


async def start(request, work, name="rngrid-gateway-call"):
    """(first event, async iterator of the rest) of ``work`` run for ``request``.
    Raises what the work raised before its first event; Stopped when the
    client left before it."""
    events = Call(work, name=name).events(request.scope["rngrid.gone"])
    try:
        first = await anext(events)
    except StopAsyncIteration:  # the work ended without a word: only when its client left
        raise Stopped() from None
    return first, events


async def embedded(request, gateway, model, texts, tower, dimensions):
    """The client.Embeddings of ``texts`` by ``model`` for an HTTP request
    (OpenAI's and Ollama's routes alike). Raises ApiError(400) when
    ``dimensions`` asks for more than the model gives; WireError as the Grid does."""
    result, events = await start(request, embeddings_work(gateway.grid, model, texts, tower, gateway.busy_wait_s))
    await events.aclose()
    if dimensions is not None and dimensions > result.dims:
        raise bad_request(f"'dimensions' is {dimensions}, more than the {result.dims} of {model!r}", "dimensions")
    return result
