"""Grid errors as HTTP: status codes, OpenAI's error shape and Ollama's.

Every error the OpenAI side answers is ``{"error": {"message", "type",
"param", "code"}}`` (OpenAI's shape; ``code`` is the grid's WireError code, or
OpenAI's ``model_not_found`` when no tower heard has the model), with
``retry_after`` (seconds) added for busy answers. The Ollama side (``/api/``)
answers ``{"error": message, "code", "param"?, "retry_after"?}`` (Ollama's
shape, whose clients read ``error``), with the same status codes. Nothing
answers with a traceback.
"""

import math
from typing import Any

from links.wire import Code, WireError

#: WireError code -> HTTP status. Unlisted codes are the tower's own failure: 502.
STATUS = {
    Code.BAD_REQUEST: 400, Code.CONTEXT_LENGTH_EXCEEDED: 400, Code.UNSUPPORTED: 400, Code.BAD_MANIFEST: 400,
    Code.REQUEST_TOO_LARGE: 413, Code.NOT_ALLOWED: 403, Code.UNTRUSTED: 403, Code.UNKNOWN_MODEL: 404, Code.UNKNOWN_ADAPTER: 404,
    Code.UNKNOWN_JOB: 404, Code.UNKNOWN_BLOB: 404, Code.BUSY: 429, Code.NO_TOWER: 503, Code.UNREACHABLE: 503,
    Code.INSUFFICIENT_MEMORY: 503, Code.TIMEOUT: 504, Code.INSUFFICIENT_STORAGE: 507, Code.CANCELLED: 409,
}
#: OpenAI's error ``type`` for a status.
TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "invalid_request_error", 405: "invalid_request_error", 409: "invalid_request_error",
         413: "invalid_request_error", 415: "invalid_request_error", 429: "rate_limit_error"}


class ApiError(Exception):
    """An HTTP error answer. ``param``: the request field at fault (OpenAI names it);
    ``retry_after``: seconds, for 429."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.retry_after = status, message, code, param, retry_after

    @classmethod
    def from_wire(cls, error: WireError) -> "ApiError":
        """The ApiError for a grid WireError (status per STATUS)."""
        return cls(STATUS.get(error.code, 502), error.message, code=error.code,
                   retry_after=error.retry_after if error.code == Code.BUSY else None)

    def body(self) -> dict[str, Any]:
        """The JSON body (a dict)."""
        error: dict[str, Any] = {"message": self.message, "type": TYPES.get(self.status, "server_error"),
                                 "param": self.param, "code": self.code}
        if self.retry_after is not None:
            error["retry_after"] = self.retry_after
        return {"error": error}

    def ollama_body(self) -> dict[str, Any]:
        """The JSON body in Ollama's shape (a dict)."""
        body: dict[str, Any] = {"error": self.message, "code": self.code}
        if self.param is not None:
            body["param"] = self.param
        if self.retry_after is not None:
            body["retry_after"] = self.retry_after
        return body

    def headers(self) -> dict[str, str]:
        """Extra response headers: ``Retry-After`` in whole seconds for a busy
        or overloaded answer (RFC 9110 allows no fraction). A busy answer's is
        the tower's hint rounded down, so it is never later than the place it
        waits for (at least 1: a 0 invites a retry at once); the body's
        ``retry_after`` keeps the fraction. The gateway's own 503s round up."""
        if self.status == 429:
            return {"Retry-After": str(max(1, int(self.retry_after or 1)))}
        if self.retry_after is not None:
            return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}
        return {}


def shape_for(path: str) -> str:
    """The error shape of a request path: "ollama" under ``/api``, else "openai"."""
    return "ollama" if path == "/api" or path.startswith("/api/") else "openai"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, code=code or Code.BAD_REQUEST, param=param)


def as_api_error(error: BaseException) -> ApiError:
    """ApiError for an ApiError or a WireError; anything else is a 500 without details."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, WireError):
        return ApiError.from_wire(error)
    return ApiError(500, "internal error in the gateway (see its log)", code=Code.INTERNAL)
