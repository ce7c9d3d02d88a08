"""Stream messages, coalescing and incremental UTF-8 decoding.

Unit tests with a named test double for the Link's Channel; the real Channel
path is covered in test_inference.py."""

import threading
import time

import pytest
import RNS

from links.channel import ProtocolError
from links.stream import (
    EndEvent,
    StreamCancel,
    StreamEnd,
    StreamError,
    StreamReceiver,
    StreamSender,
    TokenChunk,
    TokenEvent,
)
from links.wire import WireError

TEXT = "Emoji 😀🚀 and CJK 日本語のテキスト, accents é à ü — done."


def events(receiver):
    """The receiver's events with the data decoded as the client does (those with text, and the end)."""
    return [e for e in receiver.decoded_events(idle_timeout=2) if isinstance(e, EndEvent) or e.text]


def test_every_split_point_decodes_intact():
    data = TEXT.encode()
    for cut in range(1, len(data)):
        r = StreamReceiver(1)
        r.deliver(TokenChunk(1, 0, data[:cut]))
        r.deliver(TokenChunk(1, 1, data[cut:]))
        r.deliver(StreamEnd(1, "stop", {}))
        pieces = [e.text for e in events(r) if isinstance(e, TokenEvent)]
        assert "".join(pieces) == TEXT
        assert all("\ufffd" not in p for p in pieces)


def test_byte_by_byte():
    r = StreamReceiver(5)
    for i, b in enumerate(TEXT.encode()):
        r.deliver(TokenChunk(5, i, bytes([b])))
    r.deliver(StreamEnd(5, "length", {"completion_tokens": 3}))
    out = events(r)
    assert "".join(e.text for e in out if isinstance(e, TokenEvent)) == TEXT
    assert out[-1] == EndEvent("length", {"completion_tokens": 3})


def test_gap_and_error_raise():
    r = StreamReceiver(1)
    r.deliver(TokenChunk(1, 1, b"x"))
    with pytest.raises(WireError, match="expected 0"):
        events(r)
    r = StreamReceiver(1)
    r.deliver(StreamError(1, "cancelled", "by you"))
    with pytest.raises(WireError) as e:
        events(r)
    assert e.value.code == "cancelled"


def test_idle_timeout():
    r = StreamReceiver(1)
    with pytest.raises(WireError, match="no tokens for"):
        list(r.events(idle_timeout=0.2))


@pytest.mark.parametrize("message", [TokenChunk(3, 4, b"abc", [17, 99]), StreamEnd(3, "stop", {"a": 1}),
                                     StreamError(3, "busy", "later"), StreamCancel(3)])
def test_messages_round_trip(message):
    copy = type(message)()
    copy.unpack(message.pack())
    assert copy.__dict__ == message.__dict__


@pytest.mark.parametrize("cls, raw", [(TokenChunk, b"\xc1"), (TokenChunk, b"\x94\x01\x02\xa1x\x90"),
                                      (TokenChunk, b"\x94\x01\x02\xc4\x01x\x91\xff"),
                                      (StreamEnd, b"\x93\x01\xa1x\x05"), (StreamCancel, b"\x91\xff"),
                                      (StreamError, b"\x92\x01\x02")])
def test_malformed_messages_rejected(cls, raw):
    with pytest.raises(ProtocolError):
        cls().unpack(raw)


class ChannelDouble:
    """Test double for an RNS Channel: a window we open and close by hand."""

    def __init__(self):
        self.ready = True
        self.mdu = 64

    def is_ready_to_send(self):
        return self.ready


class LinkDouble:
    """Test double for an RNS Link: only status, rtt and teardown."""

    def __init__(self):
        self.status = RNS.Link.ACTIVE
        self.rtt = 0.001

    def teardown(self):
        self.status = RNS.Link.CLOSED


class RouterDouble:
    """Test double for ChannelRouter: records what would go on the wire."""

    def __init__(self):
        self.channel = ChannelDouble()
        self.link = LinkDouble()
        self.usable = True
        self.sent = []
        self.done = threading.Event()

    def wait_window(self):
        while self.usable and not self.channel.ready:
            time.sleep(0.01)
        if not self.usable:
            self.link.teardown()
        return self.usable

    def payload_limit(self, overhead):
        return 16

    def send(self, message):
        self.sent.append(message)
        if not isinstance(message, TokenChunk):
            self.done.set()
        return True


def test_sender_coalesces_while_window_full_and_splits_at_mdu():
    router = RouterDouble()
    router.channel.ready = False
    sender = StreamSender(router, 9)
    for i, ch in enumerate("abcdefghij" * 4):
        sender.push(ch.encode(), [i])
    time.sleep(0.1)
    assert router.sent == [], "nothing may be sent while the window is full"
    router.channel.ready = True
    sender.end("stop", {})
    assert router.done.wait(2)
    chunks = [m for m in router.sent if isinstance(m, TokenChunk)]
    assert b"".join(m.data for m in chunks) == b"abcdefghij" * 4
    assert [i for m in chunks for i in m.ids] == list(range(40)), "every token id travels with its bytes"
    assert [m.seq for m in chunks] == list(range(len(chunks)))
    assert all(len(m.data) + 5 * len(m.ids) <= 16 for m in chunks) and len(chunks) == 20
    assert isinstance(router.sent[-1], StreamEnd)


def test_sender_sends_at_once_when_window_open():
    router = RouterDouble()
    sender = StreamSender(router, 1)
    sender.push(b"x")
    deadline = time.monotonic() + 1
    while not router.sent and time.monotonic() < deadline:
        time.sleep(0.001)
    assert router.sent and router.sent[0].data == b"x"
    sender.fail("cancelled", "bye")
    assert router.done.wait(2) and isinstance(router.sent[-1], StreamError)


class InterfaceDouble:
    """Test double for an RNS interface that went offline."""
    online = False


class FullChannelDouble(ChannelDouble):
    """Test double for a Channel whose window never opens."""

    def __init__(self):
        super().__init__()
        self.ready = False

    def add_message_handler(self, handler):
        pass


def test_router_tears_down_a_link_whose_interface_vanished():
    from links.channel import ChannelRouter
    link = LinkDouble()
    link.attached_interface = InterfaceDouble()
    link.get_channel = FullChannelDouble
    router = ChannelRouter(link)
    assert router.wait_window() is False
    assert link.status == RNS.Link.CLOSED


def test_messages_too_big_for_the_link_are_shrunk_or_not_sent():
    from links.channel import ChannelRouter
    from links.chunks import TransferEnd

    class SmallChannelDouble(ChannelDouble):
        """Test double for the Channel of a 500-byte-MTU radio link."""

        def __init__(self):
            super().__init__()
            self.mdu, self.sent = 425, []

        def add_message_handler(self, handler):
            pass

        def send(self, message):
            self.sent.append(message)

    link = LinkDouble()
    channel = SmallChannelDouble()
    link.get_channel = lambda: channel
    router = ChannelRouter(link)
    report = {"fetched": {f"tower-{i}": i for i in range(60)}}
    assert router.send(TransferEnd(7, False, "incomplete", "why " * 500, report))
    assert len(channel.sent[0].pack()) <= 425 and channel.sent[0].code == "incomplete"
    assert not router.send(TokenChunk(1, 0, b"x" * 1000, [])), "what cannot shrink is not sent"
    assert len(channel.sent) == 1
    # Text is cut by its UTF-8 size, not its length in characters.
    assert router.send(StreamError(3, "internal", "é" * 2000))
    assert len(channel.sent[1].pack()) <= 425 and channel.sent[1].message.startswith("éé")


def test_a_chunk_request_id_runs_once_per_link():
    from links.chunks import ChunkError, ChunkRequest, ChunkServer

    class HandlerRouterDouble(RouterDouble):
        """Test double for ChannelRouter that also records message handlers."""

        def on(self, cls, handler):
            pass

    router = HandlerRouterDouble()
    release = threading.Event()
    server = ChunkServer(router, lambda blob_id, index: release.wait(5) and b"data", lambda blob_id: None)
    for _ in range(3):
        server._request(ChunkRequest(7, b"\x01" * 32, [0]))
    deadline = time.monotonic() + 5
    while len([m for m in router.sent if isinstance(m, ChunkError)]) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    refusals = [m for m in router.sent if isinstance(m, ChunkError)]
    release.set()
    assert len(refusals) == 2 and all(m.code == "bad_request" and m.xfer_id == 7 for m in refusals)


def test_stream_usage_round_trips_and_distrusts_the_wire():
    from links.usage import StreamUsage
    usage = StreamUsage(12, 8, 0.05, 40.0, 0.001, "tower-a", cached_tokens=4, split=("ab" * 16,), prompt_s=0.04,
                        decode_s=0.175)
    assert StreamUsage.from_map(usage.to_map()) == usage
    assert StreamUsage.from_map({"prompt_tokens": True, "tokens_per_s": float("nan"), "tower": "x\n",
                                 "split": ["zz" * 16], "prompt_s": -1.0, "decode_s": "1", "future": 1}) == StreamUsage()


def _end_usages():
    from links.usage import EmbeddingsUsage, StreamUsage
    from reticulum_grid.voice.request import SpeechEnd, TranscriptEnd
    inference = StreamUsage(12, 8, 0.05, 40.0, 0.001, "tower-a")
    return [inference, EmbeddingsUsage(usage=StreamUsage(prompt_tokens=5, tower="tower-a"), dims=576, count=2),
            TranscriptEnd("en", 0.98, 3.2, 0.4, 8.0, 0.01, 2, "whisper", "tower-a"),
            SpeechEnd("opus", 22050, 1.5, 0.1, 15.0, 0.0, "en", "espeak", "tower-a")]


@pytest.mark.parametrize("end", _end_usages(), ids=lambda end: end.KIND)
def test_each_end_usage_is_tagged_and_decoded_by_its_tag(end):
    from links.stream import StreamEnd
    from links.usage import USAGE_KIND, EndUsage, decode_usage
    message = StreamEnd(3, "stop", end.to_map())
    received = StreamEnd()
    received.unpack(message.pack())  # as it crosses a Link
    assert received.usage[USAGE_KIND] == end.KIND and EndUsage.kinds()[end.KIND] is type(end)
    assert decode_usage(received.usage, type(end)) == end
    for other in _end_usages():
        if type(other) is not type(end):  # another stream's figures are refused, not misread
            with pytest.raises(WireError) as e:
                decode_usage(received.usage, type(other))
            assert e.value.code == "internal" and repr(end.KIND) in e.value.message


@pytest.mark.parametrize("end", _end_usages(), ids=lambda end: end.KIND)
def test_an_untagged_end_usage_from_an_older_tower_still_decodes(end):
    from links.usage import USAGE_KIND, decode_usage
    old = {k: v for k, v in end.to_map().items() if k != USAGE_KIND}  # what towers sent before the tag
    assert decode_usage(old, type(end)) == end
    future = {**end.to_map(), USAGE_KIND: "hologram"}  # a shape a newer tower may add
    assert decode_usage(future, type(end)) == end


def test_an_end_usage_that_is_not_a_map_reads_as_unknown_figures():
    from links.usage import EmbeddingsUsage, StreamUsage, decode_usage
    from reticulum_grid.voice.request import TranscriptEnd
    assert decode_usage(["x"], StreamUsage) == StreamUsage()
    assert decode_usage(None, EmbeddingsUsage) == EmbeddingsUsage()
    assert decode_usage(7, TranscriptEnd).tower == ""
