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
import logging
import queue
import threading
import time

import msgpack
import RNS
from RNS.Channel import ChannelException

from links.wire import Code, WireError

log = logging.getLogger("rngrid.links")

#: Longest a produced token may wait before it is sent (seconds).
FLUSH_S = 0.05
#: Poll period while the Channel window is full (seconds).
WINDOW_POLL_S = 0.003
#: A window that stays shut this long (seconds, or 10 RTTs if longer) means the
#: peer is gone without a teardown (e.g. killed behind a transport node).
STALL_S = 10.0
#: Envelope room taken by TokenChunk's own fields (msgpack array, ids, bin header).
CHUNK_OVERHEAD = 24
MAX_STREAM_ID = (1 << 63) - 1


class StreamProtocolError(ValueError):
    pass


def _unpack(raw, length):
    try:
        value = msgpack.unpackb(raw, raw=False)
    except Exception as e:
        raise StreamProtocolError(f"malformed stream message: {e}") from None
    if not isinstance(value, list) or len(value) != length:
        raise StreamProtocolError("stream message has the wrong shape")
    return value


def _uint(value, what, hi=MAX_STREAM_ID):
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= hi:
        raise StreamProtocolError(f"{what} is not an unsigned integer")
    return value


def _str(value, what, limit=4096):
    if not isinstance(value, str) or len(value) > limit:
        raise StreamProtocolError(f"{what} is not a short string")
    return value


class TokenChunk(RNS.MessageBase):
    MSGTYPE = 0x0101

    def __init__(self, stream_id=0, seq=0, data=b""):
        self.stream_id, self.seq, self.data = stream_id, seq, data

    def pack(self):
        return msgpack.packb([self.stream_id, self.seq, self.data], use_bin_type=True)

    def unpack(self, raw):
        stream_id, seq, data = _unpack(raw, 3)
        if not isinstance(data, bytes):
            raise StreamProtocolError("token chunk data is not bytes")
        self.stream_id, self.seq, self.data = _uint(stream_id, "stream id"), _uint(seq, "seq"), data


class StreamEnd(RNS.MessageBase):
    MSGTYPE = 0x0102

    def __init__(self, stream_id=0, finish_reason="", usage=None):
        self.stream_id, self.finish_reason, self.usage = stream_id, finish_reason, usage or {}

    def pack(self):
        return msgpack.packb([self.stream_id, self.finish_reason, self.usage], use_bin_type=True)

    def unpack(self, raw):
        stream_id, reason, usage = _unpack(raw, 3)
        if not isinstance(usage, dict):
            raise StreamProtocolError("usage is not a map")
        self.stream_id, self.finish_reason, self.usage = _uint(stream_id, "stream id"), _str(reason, "finish reason", 32), usage


class StreamError(RNS.MessageBase):
    MSGTYPE = 0x0103

    def __init__(self, stream_id=0, code="", message=""):
        self.stream_id, self.code, self.message = stream_id, code, message

    def pack(self):
        return msgpack.packb([self.stream_id, self.code, self.message], use_bin_type=True)

    def unpack(self, raw):
        stream_id, code, message = _unpack(raw, 3)
        self.stream_id, self.code, self.message = _uint(stream_id, "stream id"), _str(code, "code", 64), _str(message, "message")


class StreamCancel(RNS.MessageBase):
    MSGTYPE = 0x0104

    def __init__(self, stream_id=0):
        self.stream_id = stream_id

    def pack(self):
        return msgpack.packb([self.stream_id])

    def unpack(self, raw):
        (stream_id,) = _unpack(raw, 1)
        self.stream_id = _uint(stream_id, "stream id")


MESSAGE_TYPES = (TokenChunk, StreamEnd, StreamError, StreamCancel)


class StreamRouter:
    """Routes a Link Channel's stream messages to per-stream callbacks.

    One per Link, on both ends. Messages for unknown streams are dropped;
    ``on_cancel(stream_id)`` receives StreamCancel messages (tower side)."""

    def __init__(self, link, on_cancel=None):
        self.link = link
        self.channel = link.get_channel()
        self.on_cancel = on_cancel
        self._routes = {}
        self._lock = threading.Lock()
        for message_type in MESSAGE_TYPES:
            self.channel.register_message_type(message_type)
        self.channel.add_message_handler(self._handle)

    def add(self, stream_id, callback):
        with self._lock:
            self._routes[stream_id] = callback

    def remove(self, stream_id):
        with self._lock:
            self._routes.pop(stream_id, None)

    def _handle(self, message):
        if not isinstance(message, MESSAGE_TYPES):
            return False
        if isinstance(message, StreamCancel):
            if self.on_cancel is not None:
                self.on_cancel(message.stream_id)
            return True
        with self._lock:
            callback = self._routes.get(message.stream_id)
        if callback is not None:
            callback(message)
        return True

    def send(self, message, timeout=10.0):
        """Send one message, waiting (bounded) for the Channel window.

        Returns False if the Link closed or the window stayed full past ``timeout``."""
        deadline = time.monotonic() + timeout
        while self.link.status != RNS.Link.CLOSED and time.monotonic() < deadline:
            if self.channel.is_ready_to_send():
                try:
                    self.channel.send(message)
                    return True
                except ChannelException:
                    pass  # another stream took the window between check and send
            time.sleep(WINDOW_POLL_S)
        return False

    def link_usable(self):
        """False once the Link is closed or the interface it runs on went away.

        rns 0.9.4 keeps a Link whose TCP peer vanished open for minutes and
        silently drops what is sent on it, so a stream would keep generating
        for nobody; a sender that finds the link unusable tears it down."""
        if self.link.status == RNS.Link.CLOSED:
            return False
        interface = getattr(self.link, "attached_interface", None)
        return interface is None or (interface.online and interface in RNS.Transport.interfaces)

    def max_chunk_bytes(self):
        """Token bytes that fit one TokenChunk on this Link (follows the negotiated MDU)."""
        return max(1, self.channel.mdu - CHUNK_OVERHEAD)


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
        limit = self.router.max_chunk_bytes()
        while True:
            with self._cond:
                while not self._buffer and self._terminal is None:
                    self._cond.wait(FLUSH_S)
                terminal = None if self._buffer else self._terminal
            if terminal is not None:
                self.router.send(terminal)
                return
            if not self._wait_window():
                return
            with self._cond:
                data = bytes(self._buffer[:limit])  # take what accumulated while waiting
                del self._buffer[:len(data)]
            if not self.router.send(TokenChunk(self.stream_id, self._seq, data)):
                return
            self._seq += 1

    def _wait_window(self):
        router = self.router
        deadline = time.monotonic() + max(STALL_S, 10 * (router.link.rtt or 0))
        while router.link_usable():
            if router.channel.is_ready_to_send():
                return True
            if time.monotonic() > deadline:
                break
            time.sleep(WINDOW_POLL_S)
        if router.link.status != RNS.Link.CLOSED:
            log.info("link %s unusable or stalled; tearing it down", router.link)
            router.link.teardown()
        return False


class StreamReceiver:
    """Client side: one stream's messages as events, text decoded incrementally.

    ``events(timeout)`` yields ``("text", str)`` and finally ``("end", reason, usage)``;
    raises WireError on an error message, a gap or an idle ``timeout`` (seconds)."""

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

    def events(self, idle_timeout):
        while True:
            try:
                message = self._queue.get(timeout=idle_timeout)
            except queue.Empty:
                raise WireError(Code.TIMEOUT, f"no data for {idle_timeout:.0f} s") from None
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
