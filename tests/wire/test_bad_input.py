"""Bad input gets a clear error with a code, and the tower keeps serving."""

import struct
import threading

import msgpack
import pytest
import RNS

from links import protocol, wire
from links.stream import StreamCancel
from links.wire import Code, WireError
from reticulum_grid.client import Usage
from reticulum_grid.inference.default_model import DEFAULT_ALIAS
from reticulum_grid.node.connection import wait_until


@pytest.fixture(scope="module")
def tower(hub):
    t = hub.start_tower("bad-a")
    yield t
    hub.stop_towers([t])


@pytest.fixture(scope="module")
def conn(hub, tower):
    return hub.grid.connection(hub.wait_tower(tower.name))


def raw_request(conn, data, path="ai/inference", timeout=30):
    link = conn.ensure_link()
    done, box = threading.Event(), {}
    link.request(path, data, timeout=timeout, failed_callback=lambda _: done.set(),
                 response_callback=lambda r: (box.setdefault("r", r.response), done.set()))
    assert done.wait(timeout + 1) and "r" in box, "the tower must answer, not time out"
    with pytest.raises(WireError) as e:
        wire.parse_response(box["r"])
    return e.value


def assert_still_serving(hub, conn):
    pieces = list(hub.grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "prompt": "Hello", "max_tokens": 3},
                                   tower=conn.name))
    assert isinstance(pieces[-1], Usage) and pieces[-1].completion_tokens > 0


def request(**fields):
    return wire.pack(protocol.stamp({"model": DEFAULT_ALIAS, "prompt": "hi", "stream_id": 1, **fields}))


@pytest.mark.parametrize("data, code, words", [
    (b"\xc1\xff\x00garbage", Code.BAD_REQUEST, "malformed msgpack"),
    (msgpack.packb([1, 2, 3]), Code.BAD_REQUEST, "must be a map"),
    ("a str, not bytes", Code.BAD_REQUEST, "msgpack bytes"),
    (None, Code.BAD_REQUEST, "msgpack bytes"),
    (request(max_tokens="lots"), Code.BAD_REQUEST, "'max_tokens' must be int"),
    (request(temperature=[1]), Code.BAD_REQUEST, "'temperature' must be float"),
    (request(messages=[{"role": "user", "content": 5}], prompt=None), Code.BAD_REQUEST, "content must be a string"),
    (request(colour="blue"), Code.BAD_REQUEST, "unknown field"),
    (request(model="no-such-model"), Code.UNKNOWN_MODEL, DEFAULT_ALIAS),
])
def test_bad_request_answered_with_code(hub, conn, data, code, words):
    error = raw_request(conn, data)
    assert error.code == code and words in error.message, error
    assert_still_serving(hub, conn)


def test_prompt_beyond_the_context_window(hub, conn):
    # Tokenizing happens after admission, so the refusal ends the stream.
    with pytest.raises(WireError) as e:
        list(hub.grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "prompt": "word " * 6000},
                              tower=conn.name))
    assert e.value.code == Code.CONTEXT_LENGTH_EXCEEDED and "context window is 4096 tokens" in e.value.message
    assert_still_serving(hub, conn)


def test_oversized_request_refused(hub, conn):
    error = raw_request(conn, request(prompt="x" * (wire.MAX_REQUEST_BYTES + 10)), timeout=120)
    assert error.code == Code.REQUEST_TOO_LARGE
    assert_still_serving(hub, conn)


def test_duplicate_stream_id_refused(hub, conn):
    # A resend of the same bytes is answered as before (test_resend.py); another request is refused.
    data = request(prompt="Count to fifty: 1, 2,", max_tokens=400, stream_id=77)
    link = conn.ensure_link()
    first = threading.Event()
    link.request("ai/inference", data, response_callback=lambda r: first.set(), timeout=30)
    assert first.wait(30)
    error = raw_request(conn, request(prompt="Another prompt", stream_id=77))
    assert error.code == Code.BAD_REQUEST and "already in use" in error.message


def test_garbage_channel_message_is_ignored(hub, tower, conn):
    # A stream cancel that is no msgpack, on the Link this client streams on (the
    # next sequence number of its Channel, as its next real message would have):
    # the tower reads it, refuses it in our decoder, and the same Link serves on
    # (tests/wire/test_channel_garbage.py has more of these, on a Link of their own).
    link = conn.ensure_link()
    before = tower.log().count("malformed message")
    sequence = link.get_channel()._next_sequence
    RNS.Packet(link, struct.pack(">HHH", StreamCancel.MSGTYPE, sequence, 3) + b"\xc1\xc1\xc1",
               context=RNS.Packet.CHANNEL).send()
    assert wait_until(lambda: tower.log().count("malformed message") > before, 10), "the garbage never arrived"
    assert_still_serving(hub, conn)


@pytest.mark.parametrize("payload", [{"model": "m"}, {"model": "m", "input": 3}, {"model": "m", "input": [1]},
                                     {"model": "m", "input": []}], ids=["no input", "a number", "not text", "empty"])
def test_embeddings_without_text_input_are_a_bad_request(hub, payload):
    with pytest.raises(WireError) as refused:
        hub.grid.execute("ai/embeddings", payload)
    assert refused.value.code == Code.BAD_REQUEST and "'input'" in refused.value.message
