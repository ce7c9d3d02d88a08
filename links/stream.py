"""Token streams over an RNS Link's Channel (ordered, reliable).

Message types (msgpack arrays inside Channel envelopes):

- ``TokenChunk``  0x0101 ``[stream_id, seq, utf8_bytes]`` - seq counts chunks from 0;
  the bytes may end or start inside a multibyte character.
- ``StreamEnd``   0x0102 ``[stream_id, finish_reason, usage]`` - usage is a map:
  prompt_tokens, completion_tokens, ttft_s (seconds), tokens_per_s, tower.
- ``StreamError`` 0x0103 ``[stream_id, code, message]``
- ``StreamCancel`` 0x0104 ``[stream_id]`` - client to tower.

A tower coalesces tokens into one chunk while the Channel window is full (a
slow link) and otherwise sends at once; nothing waits longer than FLUSH_S.
The client decodes UTF-8 incrementally, so a character split across tokens or
chunks is never broken.
"""

import codecs
import queue
import threading

import msgpack
import RNS

from links.channel import (
    MAX_ID,
    ProtocolError,
    get_alive,
    short_str,
    uint,
    unpack_array,
)
from links.wire import WireError

#: Longest a produced token may wait before it is sent (seconds).
FLUSH_S = 0.05
#: Envelope room taken by TokenChunk's own fields (msgpack array, ids, bin header).
CHUNK_OVERHEAD = 24
MAX_STREAM_ID = MAX_ID


class TokenChunk(RNS.MessageBase):
    MSGTYPE = 0x0101

    def __init__(self, stream_id=0, seq=0, data=b""):
        self.stream_id, self.seq, self.data = stream_id, seq, data

    def pack(self):
        return msgpack.packb([self.stream_id, self.seq, self.data], use_bin_type=True)

    def unpack(self, raw):
        stream_id, seq, data = unpack_array(raw, 3)
        if not isinstance(data, bytes):
            raise ProtocolError("token chunk data is not bytes")
        self.stream_id, self.seq, self.data = uint(stream_id, "stream id"), uint(seq, "seq"), data


class StreamEnd(RNS.MessageBase):
    MSGTYPE = 0x0102

    def __init__(self, stream_id=0, finish_reason="", usage=None):
        self.stream_id, self.finish_reason, self.usage = stream_id, finish_reason, usage or {}

    def pack(self):
        return msgpack.packb([self.stream_id, self.finish_reason, self.usage], use_bin_type=True)

    def unpack(self, raw):
        stream_id, reason, usage = unpack_array(raw, 3)
        if not isinstance(usage, dict):
            raise ProtocolError("usage is not a map")
        self.stream_id, self.finish_reason, self.usage = uint(stream_id, "stream id"), short_str(reason, "finish reason", 32), usage


class StreamError(RNS.MessageBase):
    MSGTYPE = 0x0103

    def __init__(self, stream_id=0, code="", message=""):
        self.stream_id, self.code, self.message = stream_id, code, message

    def pack(self):
        return msgpack.packb([self.stream_id, self.code, self.message], use_bin_type=True)

    def unpack(self, raw):
        stream_id, code, message = unpack_array(raw, 3)
        self.stream_id, self.code, self.message = uint(stream_id, "stream id"), short_str(code, "code", 64), short_str(message, "message")


class StreamCancel(RNS.MessageBase):
    MSGTYPE = 0x0104

    def __init__(self, stream_id=0):
        self.stream_id = stream_id

    def pack(self):
        return msgpack.packb([self.stream_id])

    def unpack(self, raw):
        (stream_id,) = unpack_array(raw, 1)
        self.stream_id = uint(stream_id, "stream id")


class StreamRoutes:
    """Routes a Link's stream messages to per-stream callbacks, on a ChannelRouter.

    Messages for unknown streams are dropped; ``on_cancel(stream_id)`` receives
    StreamCancel messages (tower side)."""

    def __init__(self, router, on_cancel=None):
        self.router = router
        self.on_cancel = on_cancel
        self._routes = {}
        self._lock = threading.Lock()
        for message_type in (TokenChunk, StreamEnd, StreamError):
            router.on(message_type, self._deliver)
        router.on(StreamCancel, self._cancel)

    def add(self, stream_id, callback):
        with self._lock:
            self._routes[stream_id] = callback

    def remove(self, stream_id):
        with self._lock:
            self._routes.pop(stream_id, None)

    def _deliver(self, message):
        with self._lock:
            callback = self._routes.get(message.stream_id)
        if callback is not None:
            callback(message)

    def _cancel(self, message):
        if self.on_cancel is not None:
            self.on_cancel(message.stream_id)


class StreamSender:
    """Tower side: one stream's bytes to the client, coalesced while the window is full.

    ``push(data)`` never blocks the generator; a sender thread flushes. ``end()``
    and ``fail()`` queue the terminal message after all pushed bytes."""

    def __init__(self, router, stream_id):
        self.router = router
        self.stream_id = stream_id
        self._buffer = bytearray()
        self._terminal = None
        self._seq = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"rngrid-stream-{stream_id}", daemon=True)
        self._thread.start()

    def push(self, data):
        if not data:
            return
        with self._cond:
            self._buffer += data
            self._cond.notify()

    def end(self, finish_reason, usage):
        self._finish(StreamEnd(self.stream_id, finish_reason, usage))

    def fail(self, code, message):
        self._finish(StreamError(self.stream_id, code, message))

    def join(self, timeout=None):
        self._thread.join(timeout)

    def _finish(self, message):
        with self._cond:
            if self._terminal is None:
                self._terminal = message
            self._cond.notify()

    def _run(self):
        limit = self.router.payload_limit(CHUNK_OVERHEAD)
        while True:
            with self._cond:
                while not self._buffer and self._terminal is None:
                    self._cond.wait(FLUSH_S)
                terminal = None if self._buffer else self._terminal
            if terminal is not None:
                self.router.send(terminal)
                return
            if not self.router.wait_window():
                return
            with self._cond:
                data = bytes(self._buffer[:limit])  # take what accumulated while waiting
                del self._buffer[:len(data)]
            if not self.router.send(TokenChunk(self.stream_id, self._seq, data)):
                return
            self._seq += 1

class StreamReceiver:
    """Client side: one stream's messages as events, text decoded incrementally.

    ``events(timeout, router)`` yields ``("text", str)`` and finally ``("end", reason, usage)``;
    raises WireError on an error message, a gap, an idle ``timeout`` (seconds) or,
    with the Link's ``router``, a Link that died without a teardown."""

    def __init__(self, stream_id):
        self.stream_id = stream_id
        self._queue = queue.Queue()
        # "ignore" drops a character cut off by max_tokens, as llama-cpp-python's
        # own completion does, so a joined stream equals the non-streamed text.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")
        self._next_seq = 0

    def deliver(self, message):
        self._queue.put(message)

    def abort(self, code, message):
        """Called when the Link drops: ends the stream with an error."""
        self._queue.put(StreamError(self.stream_id, code, message))

    def events(self, idle_timeout, router=None):
        while True:
            message = get_alive(self._queue, router, idle_timeout, "tokens")
            if isinstance(message, TokenChunk):
                if message.seq != self._next_seq:
                    raise WireError("bad_stream", f"chunk {message.seq} arrived, expected {self._next_seq}")
                self._next_seq += 1
                text = self._decoder.decode(message.data)
                if text:
                    yield ("text", text)
            elif isinstance(message, StreamEnd):
                tail = self._decoder.decode(b"", final=True)
                if tail:
                    yield ("text", tail)
                yield ("end", message.finish_reason, message.usage)
                return
            elif isinstance(message, StreamError):
                raise WireError(message.code, message.message)
