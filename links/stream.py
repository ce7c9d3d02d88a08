"""Token streams over an RNS Link's Channel (ordered, reliable).

Message types (msgpack arrays inside Channel envelopes):

- ``TokenChunk``  0x0101 ``[stream_id, seq, utf8_bytes, [token id, ...], extra]`` - seq
  counts chunks from 0; the bytes may end or start inside a multibyte character;
  the ids are the tokens those bytes came from (so another tower of the same
  model can continue exactly where this one stopped). ``extra`` (a map, often
  empty): ``n`` tokens generated when that differs from the ids given,
  ``lp`` per-token log probabilities ``[{token, logprob, bytes, top: [...]}]``,
  ``tc`` OpenAI tool-call deltas ``[{index, id?, type?, function: {name?, arguments?}}]``,
  ``x`` true when the ids do not give these bytes exactly (no tower can continue from them).
  ``n`` is the tower's word: a receiver measuring a tower counts what arrived (TokenEvent.counted).
- ``StreamEnd``   0x0102 ``[stream_id, finish_reason, usage]`` - usage is a map: an
  inference stream's is links/usage.py's StreamUsage; embeddings add ``dims``
  and ``count`` to it, voice streams send their own (voice/request.py).
- ``StreamError`` 0x0103 ``[stream_id, code, message]``
- ``StreamCancel`` 0x0104 ``[stream_id]`` - client to tower.

A tower coalesces tokens into one chunk while the Channel window is full (a
slow link) and otherwise sends at once; nothing waits longer than FLUSH_S.
While it has nothing to send (queued, reading a long prompt, a slow model) it
sends an empty TokenChunk every HEARTBEAT_S (or 4 RTTs), so a client notices
within a few seconds that a tower went away, even behind a transport node.
The client decodes UTF-8 incrementally, so a character split across tokens or
chunks is never broken.
"""

import codecs
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import msgpack

from links.channel import (
    MAX_ID,
    ChannelRouter,
    ProtocolError,
    get_alive,
    uint,
)
from links.message import Message, checked, checked_new, free_text, map_field, text_field, uint_field
from links.wire import WireError

#: Longest a produced token may wait before it is sent (seconds).
FLUSH_S = 0.05
#: After a message, tokens gather this long before the next one (seconds): a
#: fast model then sends a few tokens per packet, which cuts the per-packet
#: work (encryption, delivery proofs) on both ends; the first token goes at once.
COALESCE_S = 0.025
#: Seconds between heartbeats of a stream that has nothing to send.
HEARTBEAT_S = 1.0
#: Envelope room taken by TokenChunk's own fields (msgpack array, ids, bin header).
CHUNK_OVERHEAD = 24
#: Bytes a token id takes in a TokenChunk at most (msgpack uint32).
ID_BYTES = 5
#: Bytes of text a receiver counts as one token when a chunk carries no ids:
#: English text averages about 4 bytes a token in BPE vocabularies (OpenAI's
#: tokenizer guide), so such text is not counted as more tokens than it likely was.
BYTES_PER_TOKEN = 4
MAX_STREAM_ID = MAX_ID


def _token_data(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise ProtocolError("token chunk data is not bytes and ids")
    return value


def _token_ids(value: object) -> list[int]:
    if not isinstance(value, list):
        raise ProtocolError("token chunk data is not bytes and ids")
    return [uint(i, "token id", 1 << 31) for i in value]


def check_extra(extra: object) -> dict[str, Any]:
    """A TokenChunk's extra map, checked: known keys, right types."""
    if not isinstance(extra, dict) or set(extra) - {"n", "lp", "tc", "x"}:
        raise ProtocolError("token chunk extra is not a map of n, lp, tc, x")
    if not isinstance(extra.get("x", False), bool):
        raise ProtocolError("token chunk x is not a boolean")
    if "n" in extra:
        uint(extra["n"], "token count", 1 << 31)
    for key in ("lp", "tc"):
        if key in extra and (not isinstance(extra[key], list) or not all(isinstance(x, dict) for x in extra[key])):
            raise ProtocolError(f"token chunk {key} is not a list of maps")
    return extra


@dataclass
class _Stream(Message):
    """A stream message: the stream it belongs to comes first."""
    stream_id: int = uint_field("stream id")


@dataclass
class TokenChunk(_Stream):
    MSGTYPE = 0x0101
    seq: int = uint_field("seq")
    data: bytes = checked(_token_data, b"")
    ids: list[int] = checked_new(_token_ids, list)
    extra: dict[str, Any] = checked_new(check_extra, dict)


@dataclass
class StreamEnd(_Stream):
    MSGTYPE = 0x0102
    finish_reason: str = text_field("finish reason", 32)
    usage: dict[str, Any] = map_field("usage is not a map")


@dataclass
class StreamError(_Stream):
    MSGTYPE = 0x0103
    code: str = text_field("code", 64)
    message: str = free_text(overhead=40)


@dataclass
class StreamCancel(_Stream):
    MSGTYPE = 0x0104


#: A message StreamRoutes hands to a stream (client side).
StreamMessage = TokenChunk | StreamEnd | StreamError


class StreamRoutes:
    """Routes a Link's stream messages to per-stream callbacks, on a ChannelRouter.

    Messages for unknown streams are dropped; ``on_cancel(stream_id)`` receives
    StreamCancel messages (tower side)."""

    def __init__(self, router: ChannelRouter, on_cancel: Callable[[int], None] | None = None) -> None:
        self.router = router
        self.on_cancel = on_cancel
        self._routes: dict[int, Callable[[StreamMessage], None]] = {}
        self._lock = threading.Lock()
        stream_types: tuple[type[StreamMessage], ...] = (TokenChunk, StreamEnd, StreamError)
        for message_type in stream_types:
            router.on(message_type, self._deliver)
        router.on(StreamCancel, self._cancel)

    def add(self, stream_id: int, callback: Callable[[StreamMessage], None]) -> None:
        with self._lock:
            self._routes[stream_id] = callback

    def remove(self, stream_id: int) -> None:
        with self._lock:
            self._routes.pop(stream_id, None)

    def _deliver(self, message: StreamMessage) -> None:
        with self._lock:
            callback = self._routes.get(message.stream_id)
        if callback is not None:
            callback(message)

    def _cancel(self, message: StreamCancel) -> None:
        if self.on_cancel is not None:
            self.on_cancel(message.stream_id)


class StreamSender:
    """Tower side: one stream's tokens to the client, coalesced while the window is full.

    ``push(data, ids)`` never blocks the generator; a sender thread flushes,
    whole tokens per message. ``end()`` and ``fail()`` queue the terminal
    message after all pushed tokens."""

    def __init__(self, router: ChannelRouter, stream_id: int) -> None:
        self.router = router
        self.stream_id = stream_id
        self._pieces: list[tuple[bytes, list[int], dict[str, Any]]] = []
        self._terminal: StreamEnd | StreamError | None = None
        self._seq = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"rngrid-stream-{stream_id}", daemon=True)
        self._thread.start()

    def push(self, data: bytes, ids: Iterable[int] = (), extra: dict[str, Any] | None = None) -> None:
        if not data and not ids and not extra:
            return
        with self._cond:
            self._pieces.append((data, list(ids), extra or {}))
            self._cond.notify()

    def end(self, finish_reason: str, usage: dict[str, Any]) -> None:
        self._finish(StreamEnd(self.stream_id, finish_reason, usage))

    def fail(self, code: str, message: str) -> None:
        self._finish(StreamError(self.stream_id, code, message))

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _finish(self, message: "StreamEnd | StreamError") -> None:
        with self._cond:
            if self._terminal is None:
                self._terminal = message
            self._cond.notify()

    def _run(self) -> None:
        limit = self.router.payload_limit(CHUNK_OVERHEAD)
        heartbeat = max(HEARTBEAT_S, 4 * (self.router.link.rtt or 0))
        last_sent, last_data = time.monotonic(), None
        while True:
            with self._cond:
                while not self._pieces and self._terminal is None and time.monotonic() - last_sent < heartbeat:
                    self._cond.wait(FLUSH_S)
                gather = last_data + COALESCE_S - time.monotonic() if last_data else 0
                if self._pieces and self._terminal is None and gather > 0:
                    self._cond.wait(gather)
                terminal = None if self._pieces else self._terminal
            if terminal is not None:
                self.router.send(terminal)
                return
            if not self.router.wait_window():
                return
            data, ids, extra = self._take(limit)  # nothing taken: a heartbeat
            if not self.router.send(TokenChunk(self.stream_id, self._seq, data, ids, extra)):
                return
            self._seq += 1
            last_sent = time.monotonic()
            if data:
                last_data = last_sent

    def _take(self, limit: int) -> tuple[bytes, list[int], dict[str, Any]]:
        """Whole tokens (bytes, ids and extras) that fit one message; what
        accumulated while waiting for the window goes together."""
        ids: list[int] = []
        data, n, lp, tc, size, inexact = bytearray(), 0, [], [], 0, False
        with self._cond:
            while self._pieces:
                piece, piece_ids, extra = self._pieces[0]
                more = len(piece) + ID_BYTES * len(piece_ids) + (len(msgpack.packb(extra)) if extra else 0)
                if (data or ids) and size + more > limit:
                    break
                if not data and more > limit and not extra:  # one token larger than a message: split it
                    cut = max(1, limit - ID_BYTES * len(piece_ids))
                    if len(piece) > cut:
                        self._pieces[0] = (piece[cut:], piece_ids, extra)
                        return piece[:cut], [], {}
                self._pieces.pop(0)
                data += piece
                ids += piece_ids
                n += extra.get("n", len(piece_ids))
                lp += extra.get("lp", [])
                tc += extra.get("tc", [])
                inexact = inexact or extra.get("x", False)
                size += more
        extra = {k: v for k, v in (("lp", lp), ("tc", tc), ("x", inexact)) if v}
        if n != len(ids):
            extra["n"] = n
        return bytes(data), ids, extra


class TextDecoder:
    """Incremental UTF-8: a character split across chunks (or across towers,
    after a failover) comes out whole. "ignore" drops a character a stream
    ends inside of (llama.cpp's server holds back such a character and drops
    it when max_tokens ends the stream before it is whole)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def finish(self) -> str:
        return self._decoder.decode(b"", final=True)


@dataclass(frozen=True)
class TokenEvent:
    """A token chunk as the client reads it: ``data`` UTF-8 bytes (they may
    start or end inside a character), ``ids`` the token ids they came from,
    ``extra`` the chunk's extra map (see TokenChunk); ``text`` is the bytes
    decoded, set by decoded() ("" before)."""
    data: bytes
    ids: list[int]
    extra: dict[str, Any]
    text: str = ""

    @property
    def generated(self) -> int:
        """Tokens this chunk stands for, as the tower says (``n`` when it differs from the ids)."""
        return self.extra.get("n", len(self.ids))

    @property
    def counted(self) -> int:
        """Tokens this chunk shows to a receiver that trusts none of the
        tower's figures: its token ids, at most one per byte of its text
        (every token gives at least one byte), or, without ids, one per
        BYTES_PER_TOKEN bytes (rounded up); never more than ``generated``.
        A tower that inflates ``n`` gains nothing; one that pads ids sends
        text for each."""
        own = min(len(self.ids), len(self.data)) if self.ids else -(-len(self.data) // BYTES_PER_TOKEN)
        return min(own, self.generated)


@dataclass(frozen=True)
class EndEvent:
    """A stream's end: the tower's ``finish_reason`` and its ``usage`` map
    (links/usage.py StreamUsage for an inference stream)."""
    finish_reason: str
    usage: dict[str, Any]


def decoded(events: Iterable[TokenEvent | EndEvent], decoder: TextDecoder) -> Iterator[TokenEvent | EndEvent]:
    """``events`` with each TokenEvent's ``text`` decoded by ``decoder`` (one
    decoder for a whole stream, kept across towers after a failover); what the
    decoder still holds at the end comes as a TokenEvent with no bytes before
    the EndEvent."""
    for event in events:
        if isinstance(event, TokenEvent):
            yield replace(event, text=decoder.feed(event.data))
            continue
        tail = decoder.finish()
        if tail:
            yield TokenEvent(b"", [], {}, tail)
        yield event


class StreamReceiver:
    """Client side: one stream's messages as events.

    ``events(timeout, router)`` yields a TokenEvent per chunk with content and
    finally one EndEvent; raises WireError on an error message, a gap, an
    idle ``timeout`` (seconds) or, with the Link's ``router``, a Link that died
    without a teardown."""

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id
        self._queue: queue.Queue[StreamMessage] = queue.Queue()
        self._next_seq = 0

    def deliver(self, message: "StreamMessage") -> None:
        self._queue.put(message)

    def abort(self, code: str, message: str) -> None:
        """Called when the Link drops: ends the stream with an error."""
        self._queue.put(StreamError(self.stream_id, code, message))

    def events(self, idle_timeout: float, router: ChannelRouter | None = None) -> Iterator[TokenEvent | EndEvent]:
        """The stream's events (see the class doc); ``idle_timeout`` in seconds."""
        while True:
            message = get_alive(self._queue, router, idle_timeout, "tokens")
            if isinstance(message, TokenChunk):
                if message.seq != self._next_seq:
                    raise WireError("bad_stream", f"chunk {message.seq} arrived, expected {self._next_seq}")
                self._next_seq += 1
                if message.data or message.ids or message.extra:  # an empty chunk is a heartbeat
                    yield TokenEvent(message.data, message.ids, message.extra)
            elif isinstance(message, StreamEnd):
                yield EndEvent(message.finish_reason, message.usage)
                return
            elif isinstance(message, StreamError):
                raise WireError(message.code, message.message)

    def decoded_events(self, idle_timeout: float, router: ChannelRouter | None = None) -> Iterator[TokenEvent | EndEvent]:
        """events() decoded (see decoded()) with a decoder of this stream's own."""
        return decoded(self.events(idle_timeout, router), TextDecoder())
