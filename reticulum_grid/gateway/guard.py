"""What a web page in the user's browser may do with the gateway.

A gateway on 127.0.0.1 without an API key trusts whoever can reach it, and
any web page the user opens can send requests to 127.0.0.1. So:

- A request with an ``Origin`` header (browsers send one on cross-site
  requests) must come from the gateway's own origin or one allowed with
  ``--cors-origin``; others get 403. Allowed origins get CORS headers.
- A POST must say ``Content-Type: application/json``: a cross-site page can
  send a "simple" text/plain POST without asking first, but not a JSON one.
  OpenAI's upload routes (``MULTIPART_PATHS``) take ``multipart/form-data``,
  which a page may send too: there the Origin and Host checks are the guard
  (a browser names the page's origin on every cross-site POST).
- On a loopback bind, the ``Host`` header must name loopback (localhost,
  127.0.0.1, [::1]): a DNS-rebinding page reaches 127.0.0.1 under its own
  host name. (A gateway bound elsewhere has an API key, which such a page lacks.)
- A WebSocket handshake (websocket.py) passes the same Host and Origin checks
  (a browser sends Origin on every one, and CORS does not cover WebSockets);
  a refused one is closed before it is accepted, which answers it 403.
"""

import json
from urllib.parse import urlsplit

#: POST routes whose body is OpenAI's multipart upload (gateway/audio.py).
MULTIPART_PATHS = frozenset({"/v1/audio/transcriptions"})

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


class BrowserGuard:
    """ASGI middleware; ``origins``: extra origins allowed (e.g. "http://localhost:5173");
    ``loopback``: the gateway is bound to a loopback address."""

    def __init__(self, app, origins=(), loopback=True):
        self.origins = {o.rstrip("/") for o in origins}
        self.loopback = loopback
        self.app = CORSMiddleware(app, allow_origins=sorted(self.origins), allow_methods=["GET", "POST"],
                                  allow_headers=["Authorization", "Content-Type"]) if self.origins else app

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        problem = self.refusal(scope)
        if problem and scope["type"] == "websocket":
            # Closing before the handshake is accepted answers it 403: no command runs.
            return await send({"type": "websocket.close", "code": 1008, "reason": problem[1][:120]})
        if problem:
            return await _refuse(send, *problem)
        await self.app(scope, receive, send)

    def refusal(self, scope):
        """(status, message) when the request must be refused, else None."""
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if self.loopback and urlsplit(f"//{host}").hostname not in LOOPBACK_NAMES:
            return 403, f"Host {host!r} is not this machine: this gateway answers only to localhost/127.0.0.1"
        origin = headers.get("origin")
        if origin and origin.rstrip("/") not in self.origins and urlsplit(origin).netloc != host:
            return 403, (f"requests from web pages at {origin} are refused; "
                         f"start rngrid serve with --cors-origin {origin} to allow them")
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        multipart = content_type == "multipart/form-data" and scope["path"] in MULTIPART_PATHS
        if scope.get("method") == "POST" and content_type != "application/json" and not multipart:
            return 415, "send the request body as JSON (Content-Type: application/json)"
        return None


async def _refuse(send, status, message):
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": "forbidden" if status == 403 else "unsupported_media_type"}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
