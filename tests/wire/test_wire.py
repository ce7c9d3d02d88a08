"""Request framing and schema validation (unit tests, no network)."""

import msgpack
import pytest

from links import wire
from links.wire import Code, WireError
from reticulum_grid.inference import request as inference_request


def parse(obj):
    return inference_request.parse(wire.unpack_map(wire.pack(obj)))


def test_defaults_filled():
    r = parse({"model": "m", "prompt": "hi", "stream_id": 7})
    assert r.sampling.max_tokens == 256 and r.sampling.temperature == 0.8 and r.stream_id == 7


@pytest.mark.parametrize("data, code", [
    (b"\xc1\xc1", Code.BAD_REQUEST),
    (msgpack.packb([1, 2]), Code.BAD_REQUEST),
    (b"\x00" * (wire.MAX_REQUEST_BYTES + 1), Code.REQUEST_TOO_LARGE),
    ("not bytes", Code.BAD_REQUEST),
])
def test_unpack_errors(data, code):
    with pytest.raises(WireError) as e:
        wire.unpack_map(data)
    assert e.value.code == code


@pytest.mark.parametrize("request_map, message", [
    ({"prompt": "hi", "stream_id": 1}, "missing field 'model'"),
    ({"model": 3, "prompt": "hi", "stream_id": 1}, "'model' must be str"),
    ({"model": "m", "stream_id": 1}, "exactly one of"),
    ({"model": "m", "prompt": "a", "messages": [], "stream_id": 1}, "messages"),
    ({"model": "m", "prompt": "hi", "stream_id": 1, "max_tokens": "9"}, "'max_tokens' must be int"),
    ({"model": "m", "prompt": "hi", "stream_id": 1, "max_tokens": 0}, "outside"),
    ({"model": "m", "prompt": "hi", "stream_id": 1, "temperature": 9.0}, "outside"),
    ({"model": "m", "prompt": "hi", "stream_id": 1, "temperature": True}, "got bool"),
    ({"model": "m", "prompt": "hi", "stream_id": -1}, "outside"),
    ({"model": "m", "prompt": "hi", "stream_id": 1, "tempreature": 0.1}, "unknown field"),
    ({"model": "m", "messages": [{"role": "robot", "content": "x"}], "stream_id": 1}, "role must be one of"),
    ({"model": "m", "messages": [{"role": "user"}], "stream_id": 1}, "must be a map with 'role' and 'content'"),
    ({"model": "m", "messages": ["hi"], "stream_id": 1}, "must be a map"),
    ({"model": "m", "prompt": "hi", "stream_id": 1, "stop": [1]}, "stop"),
])
def test_schema_errors(request_map, message):
    with pytest.raises(WireError) as e:
        parse(request_map)
    assert e.value.code == Code.BAD_REQUEST and message in e.value.message


def test_int_accepted_for_float_fields():
    assert parse({"model": "m", "prompt": "x", "stream_id": 1, "temperature": 0}).sampling.temperature == 0.0


def test_error_response_round_trip():
    with pytest.raises(WireError) as e:
        wire.parse_response(wire.error(Code.BUSY, "full", retry_after=2.5))
    assert (e.value.code, e.value.message, e.value.retry_after) == (Code.BUSY, "full", 2.5)
    assert wire.parse_response(wire.ok(x=1)) == {"ok": True, "x": 1}
