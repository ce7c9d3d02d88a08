"""Request/response framing for commands on a tower Link.

A request's data is msgpack bytes of a map; a response is msgpack bytes of
either ``{"ok": True, ...fields}`` or ``{"ok": False, "error": {"code": str,
"message": str, "retry_after": float|None}}``. We pack the payloads ourselves
(RNS carries them as opaque bytes) so malformed input can be caught and
answered instead of crashing RNS's own unpacker.
"""

from collections.abc import Callable, Mapping
from typing import Any

import msgpack

#: Largest request payload a tower will parse (bytes). Prompts are text; 1 MiB
#: is ~250k tokens, far beyond any context window we serve.
MAX_REQUEST_BYTES = 1 << 20


class Code:
    """Error codes a tower answers with (stable strings; clients switch on them)."""
    BAD_REQUEST = "bad_request"
    REQUEST_TOO_LARGE = "request_too_large"
    NOT_ALLOWED = "not_allowed"
    UNKNOWN_MODEL = "unknown_model"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    BUSY = "busy"
    CANCELLED = "cancelled"
    INTERNAL = "internal"
    UNREACHABLE = "unreachable"
    TIMEOUT = "timeout"
    NO_TOWER = "no_tower"
    UNKNOWN_BLOB = "unknown_blob"
    BAD_MANIFEST = "bad_manifest"
    BAD_CHUNK = "bad_chunk"
    CORRUPT = "corrupt"
    INCOMPLETE = "incomplete"
    INSUFFICIENT_STORAGE = "insufficient_storage"
    INSUFFICIENT_MEMORY = "insufficient_memory"
    UNKNOWN_JOB = "unknown_job"
    UNSUPPORTED = "unsupported"
    UNKNOWN_ADAPTER = "unknown_adapter"
    TOO_SLOW = "too_slow"  # a transfer the link would take longer than allowed to carry
    RUNNER_LOST = "runner_lost"  # the model's engine process died mid-request; the tower restarts it
    UNTRUSTED = "untrusted"  # a tower this client does not trust (rngrid trust): nothing is sent to it
    PROTOCOL_MISMATCH = "protocol_mismatch"  # the two ends speak different protocol versions (links/protocol.py)


#: Codes that mean the peer (or the way to it) went away, not that it refused.
LINK_LOST = frozenset({Code.UNREACHABLE, Code.TIMEOUT})


class WireError(Exception):
    """An error with a code, as sent on the wire. ``retry_after`` in seconds or None."""

    def __init__(self, code: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retry_after = retry_after

    def to_map(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "retry_after": self.retry_after}


def pack(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack_map(data: object, max_bytes: int = MAX_REQUEST_BYTES, what: str = "request") -> dict[Any, Any]:
    """Decode msgpack bytes that must hold a map. Raises WireError."""
    if not isinstance(data, (bytes, bytearray)):
        raise WireError(Code.BAD_REQUEST, f"{what} must be msgpack bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise WireError(Code.REQUEST_TOO_LARGE, f"{what} is {len(data)} bytes, limit {max_bytes}")
    try:
        obj = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True)
    except Exception as e:
        raise WireError(Code.BAD_REQUEST, f"malformed msgpack: {e}") from None
    if not isinstance(obj, dict):
        raise WireError(Code.BAD_REQUEST, f"{what} must be a map, got {type(obj).__name__}")
    return obj


def ok(**fields: object) -> bytes:
    """Packed success response."""
    return pack({"ok": True, **fields})


def error(code: str, message: str, retry_after: float | None = None) -> bytes:
    """Packed error response."""
    return pack({"ok": False, "error": WireError(code, message, retry_after).to_map()})


def parse_response(data: object) -> dict[Any, Any]:
    """Client side: the response map on success; raises WireError on an error reply
    or a malformed response."""
    reply = unpack_map(data, max_bytes=1 << 26, what="response")
    if reply.get("ok") is True:
        return reply
    err = reply.get("error")
    if not isinstance(err, dict):
        raise WireError(Code.INTERNAL, "malformed error response")
    retry = err.get("retry_after")
    raise WireError(str(err.get("code", Code.INTERNAL)), str(err.get("message", "")),
                    retry if isinstance(retry, (int, float)) else None)


#: A Field check: the value in, an error string (or None when the value is fine) out.
Check = Callable[[Any], str | None]


class Field:
    """One field of a request schema: type(s), required, default and a check.

    ``check(value)`` returns an error string or None."""

    def __init__(self, types: type | tuple[type, ...], required: bool = False, default: object = None,
                 check: Check | None = None) -> None:
        self.types: tuple[type, ...] = types if isinstance(types, tuple) else (types,)
        self.required = required
        self.default = default
        self.check = check


def validate(request: Mapping[Any, Any], schema: Mapping[str, Field]) -> dict[str, Any]:
    """Check ``request`` (a map) against ``schema`` ({name: Field}).

    Returns a new dict with defaults filled in; unknown keys are an error so a
    misspelt option never passes silently. Raises WireError(bad_request)."""
    unknown = sorted(set(request) - set(schema))
    if unknown:
        raise WireError(Code.BAD_REQUEST, f"unknown field(s): {', '.join(map(str, unknown))}")
    out: dict[str, Any] = {}
    for name, spec in schema.items():
        if name not in request or request[name] is None:
            if spec.required:
                raise WireError(Code.BAD_REQUEST, f"missing field {name!r}")
            out[name] = spec.default
            continue
        value = request[name]
        if isinstance(value, bool) and bool not in spec.types:
            raise WireError(Code.BAD_REQUEST, f"field {name!r} must be {_type_names(spec)}, got bool")
        if float in spec.types and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, spec.types):
            raise WireError(Code.BAD_REQUEST, f"field {name!r} must be {_type_names(spec)}, got {type(value).__name__}")
        problem = spec.check(value) if spec.check else None
        if problem:
            raise WireError(Code.BAD_REQUEST, f"field {name!r}: {problem}")
        out[name] = value
    return out


def _type_names(spec: Field) -> str:
    return " or ".join(t.__name__ for t in spec.types)


def in_range(lo: float, hi: float) -> Check:
    """Field check: lo <= value <= hi."""
    return lambda v: None if lo <= v <= hi else f"{v} outside [{lo}, {hi}]"


def max_len(n: int) -> Check:
    """Field check: len(value) <= n (and not empty)."""
    return lambda v: None if 0 < len(v) <= n else f"length {len(v)} outside [1, {n}]"


#: Nesting json_safe keeps; deeper values become text.
JSON_SAFE_DEPTH = 16


def json_safe(value: object, depth: int = 0) -> Any:
    """A copy of a decoded msgpack value that json.dumps accepts: bytes as
    hex, map keys as text, tuples as lists, anything else JSON lacks (and
    nesting deeper than JSON_SAFE_DEPTH) as text."""
    if depth > JSON_SAFE_DEPTH:
        return repr(value)[:256]
    if isinstance(value, dict):
        return {(k.hex() if isinstance(k, bytes) else str(k)): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    if isinstance(value, (list, tuple)):
        return [json_safe(v, depth + 1) for v in value]
    if value is None or isinstance(value, (str, int, float)):
        return value
    return repr(value)[:256]
