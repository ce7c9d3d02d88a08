"""What a web page in the user's browser may do with the gateway.

A gateway on 127.0.0.1 without an API key trusts whoever can reach it, and
any web page the user opens can send requests to 127.0.0.1. So:

- A request with an ``Origin`` header must come from the gateway's own origin
  or one allowed with ``--cors-origin``; others (``null`` too) get 403; allowed
  origins get CORS headers. Browsers name the page's origin on every
  cross-site request and on every POST, from script or from a form (the Fetch
  standard's "append a request Origin header"; Firefox since 70, Chromium and
  Safari long before).
- A page may POST without asking first (a "simple" request) only as
  ``text/plain``, ``application/x-www-form-urlencoded``, ``multipart/form-data``
  or, from script, with no Content-Type. Only ``text/plain`` lets a plain HTML
  form write a JSON object (``enctype="text/plain"`` sends ``name=value``
  unescaped), and a form is how an old browser posts without an Origin: so
  ``text/plain`` is refused (415) on every route. A form's urlencoded or
  multipart body is never a JSON object, and a script's body without a type
  comes with an Origin.
- OpenAI's routes want ``application/json`` (415 otherwise), as OpenAI's API
  does; its upload routes (``MULTIPART_PATHS``) take ``multipart/form-data``.
- Ollama's routes (``/api``) read the body as JSON whatever else the
  Content-Type says, as Ollama does (its server binds JSON without looking at
  the header): litellm's Ollama routes send none, and the ``curl -d`` of
  Ollama's own API docs sends ``application/x-www-form-urlencoded``.
- On a loopback bind, the ``Host`` header must name loopback (localhost,
  127.0.0.1, [::1]): a DNS-rebinding page reaches 127.0.0.1 under its own
  host name. (A gateway bound elsewhere has an API key, which such a page lacks.)
- A WebSocket handshake (websocket.py) passes the same Host and Origin checks
  (a browser sends Origin on every one, and CORS does not cover WebSockets);
  a refused one is closed before it is accepted, which answers it 403.

Refusals come in the shape of the API the path belongs to (errors.shape_for).
"""

from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from reticulum_grid.gateway.errors import ApiError, shape_for
from reticulum_grid.gateway.http import error_response

#: POST routes whose body is OpenAI's multipart upload (gateway/audio.py).
MULTIPART_PATHS = frozenset({"/v1/audio/transcriptions"})
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}
#: The one Content-Type in which a cross-site HTML form can send a JSON object.
FORM_TEXT = "text/plain"


class BrowserGuard:
    """ASGI middleware; ``origins``: extra origins allowed (e.g. "http://localhost:5173");
    ``loopback``: the gateway is bound to a loopback address."""

    def __init__(self, app: ASGIApp, origins: Iterable[str] = (), loopback: bool = True) -> None:
        self.origins = {o.rstrip("/") for o in origins}
        self.loopback = loopback
        self.app: ASGIApp = CORSMiddleware(app, allow_origins=sorted(self.origins), allow_methods=["GET", "POST"],
                                  allow_headers=["Authorization", "Content-Type"]) if self.origins else app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        problem = self.refusal(scope)
        if problem and scope["type"] == "websocket":
            # Closing before the handshake is accepted answers it 403: no command runs.
            return await send({"type": "websocket.close", "code": 1008, "reason": problem.message[:120]})
        if problem:
            return await error_response(problem, shape_for(scope["path"]))(scope, receive, send)
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> ApiError | None:
        """The ApiError (403 or 415) to answer when the request must be refused, else None."""
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if self.loopback and urlsplit(f"//{host}").hostname not in LOOPBACK_NAMES:
            return ApiError(403, f"Host {host!r} is not this machine: this gateway answers only to "
                                 "localhost/127.0.0.1", code="forbidden")
        origin = headers.get("origin")
        if origin and origin.rstrip("/") not in self.origins and urlsplit(origin).netloc != host:
            return ApiError(403, f"requests from web pages at {origin} are refused; start rngrid serve with "
                                 f"--cors-origin {origin} to allow them", code="forbidden")
        if scope.get("method") == "POST" and not self._readable(scope["path"], headers):
            return ApiError(415, "send the request body as JSON (Content-Type: application/json)",
                            code="unsupported_media_type")
        return None

    @staticmethod
    def _readable(path: str, headers: Headers) -> bool:
        """Whether a POST's Content-Type is one its route reads (see the module doc)."""
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type == FORM_TEXT:
            return False
        if shape_for(path) == "ollama":
            return True
        return content_type == "application/json" or (content_type == "multipart/form-data"
                                                        and path in MULTIPART_PATHS)
