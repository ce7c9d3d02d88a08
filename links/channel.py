"""One router per Link Channel, on both ends: message types to handlers, and
window-aware sending shared by token streams and chunk transfers.

rns 0.9.4's Channel raises when its window is full and keeps silently dropping
what is sent on a Link whose TCP peer vanished; ``wait_window`` covers both.
"""

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import msgpack
import RNS
from RNS.Channel import CEType, ChannelException

from links.wire import Code, WireError

log = logging.getLogger("rngrid.links")

T = TypeVar("T")
M = TypeVar("M")

#: Poll period while the Channel window is full (seconds).
WINDOW_POLL_S = 0.003
#: How often a waiting receiver checks that its Link is still usable (seconds).
LIVENESS_POLL_S = 0.5
#: A window that stays shut this long (seconds, or 10 RTTs if longer) means the
#: peer is gone without a teardown (e.g. killed behind a transport node).
STALL_S = 10.0
#: Interfaces at or below this rate (bits/s) are radio-class: RNS itself gives
#: them its base 500-byte MTU (Interface.optimise_mtu on rns 0.9.4).
RADIO_BPS = 62_500
#: On a radio-class interface a window may stay shut through a fade of half a
#: minute and then until the next backed-off resend (each wait 1.5x the one
#: before, so up to ~1.5x the fade) before the peer counts as gone.
RADIO_STALL_S = 60.0
#: Sends of one Channel message before rns 0.9.4 tears its Link down (5 by
#: default), on a radio-class interface. The first wait is 2.5 RTTs times
#: (messages in flight + 1.5) and each next one 1.5x longer, so the fifth send
#: goes ~8 first waits after the first: with a short window on a LoRa link all
#: five can fall inside a half-minute fade, and the Link dies with it (measured
#: in the lab: a 30 s cut on lora-fast closed it). The eighth send goes ~32
#: first waits after the first.
RADIO_MAX_TRIES = 8
MAX_ID = (1 << 63) - 1


class ProtocolError(ValueError):
    """A Channel message that does not follow its schema."""


def get_alive(q: queue.Queue[T], router: "ChannelRouter | None", idle_timeout: float, what: str) -> T:
    """``q.get()``, checking the Link every LIVENESS_POLL_S; WireError(timeout)
    after ``idle_timeout`` seconds, WireError(unreachable) if the Link dies."""
    deadline = time.monotonic() + idle_timeout
    while True:
        try:
            return q.get(timeout=max(0.0, min(LIVENESS_POLL_S, deadline - time.monotonic())))
        except queue.Empty:
            if router is not None:
                router.check_alive()
            if time.monotonic() >= deadline:
                raise WireError(Code.TIMEOUT, f"no {what} for {idle_timeout:.0f} s") from None


def unpack_array(raw: bytes, length: int) -> list[Any]:
    """msgpack array of exactly ``length`` items, or ProtocolError."""
    try:
        value = msgpack.unpackb(raw, raw=False)
    except Exception as e:
        raise ProtocolError(f"malformed message: {e}") from None
    if not isinstance(value, list) or len(value) != length:
        raise ProtocolError("message has the wrong shape")
    return value


def uint(value: object, what: str, hi: int = MAX_ID) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= hi:
        raise ProtocolError(f"{what} is not an unsigned integer <= {hi}")
    return value


#: Longest free text (error messages, reasons) a message carries, in UTF-8
#: bytes; senders cut theirs to this and receivers cut anything longer, never
#: reject it: a message a receiver rejects has already used its Channel
#: sequence number, and every later message on that Link would wait behind the gap.
TEXT_MAX = 1024


def short_str(value: object, what: str, limit: int = TEXT_MAX) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"{what} is not a string")
    return clip(value, limit)


def clip(text: str, limit: int = TEXT_MAX) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes (marking the cut with "...")."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return text
    return data[:max(0, limit - 3)].decode("utf-8", errors="ignore") + "..."


class ChannelRouter:
    """Registers message types on a Link's Channel and routes each message to
    the handler for its type. Unknown types are left to other handlers."""

    def __init__(self, link: RNS.Link) -> None:
        self.link = link
        self.channel = link.get_channel()
        self._handlers: dict[type, Callable[[Any], None]] = {}
        self._lock = threading.Lock()
        self.channel.add_message_handler(self._handle)
        if self.on_radio():
            self.channel._max_tries = max(self.channel._max_tries, RADIO_MAX_TRIES)  # no public setter in 0.9.4

    def on_radio(self) -> bool:
        """True when this Link runs over a radio-class interface (<= RADIO_BPS)."""
        bitrate = getattr(getattr(self.link, "attached_interface", None), "bitrate", 0) or 0
        return 0 < bitrate <= RADIO_BPS

    def on(self, message_type: type[M], handler: Callable[[M], None]) -> None:
        """Call ``handler(message)`` for every ``message_type`` message."""
        with self._lock:
            if message_type not in self._handlers:
                self.channel.register_message_type(message_type)
            self._handlers[message_type] = handler

    def _handle(self, message: RNS.MessageBase) -> bool:
        handler = self._handlers.get(type(message))
        if handler is None:
            return False
        handler(message)
        return True

    def describe(self) -> str:
        """This Channel's sequence state, for a log line when traffic stops: the next
        sequence it waits for and those it holds out of order (receive side); the
        envelopes not yet acknowledged, each with its sequence, tries and whether its
        packet has a receipt (send side); and the window. Reads rns 0.9.4's private
        fields (no public view exists)."""
        channel = self.channel
        try:
            with channel._lock:
                held = [e.sequence for e in channel._rx_ring]
                sent = [(e.sequence, e.tries, bool(e.packet is not None and getattr(e.packet, "receipt", None)))
                        for e in channel._tx_ring]
                return (f"rx next {channel._next_rx_sequence} held {held[:8]}{'...' if len(held) > 8 else ''}; "
                        f"tx next {channel._next_sequence} unacknowledged (seq, tries, receipt) {sent[:8]}"
                        f"{'...' if len(sent) > 8 else ''}; window {channel.window}/{channel.window_max}; "
                        f"link status {self.link.status}")
        except AttributeError as e:  # another RNS release
            return f"channel state unreadable: {e}"

    def link_usable(self) -> bool:
        """False once the Link is closed or the interface it runs on went away.

        rns 0.9.4 keeps a Link whose TCP peer vanished open for minutes and
        silently drops what is sent on it, so a sender that finds the link
        unusable tears it down."""
        if self.link.status == RNS.Link.CLOSED:
            return False
        interface = getattr(self.link, "attached_interface", None)
        return interface is None or (interface.online and interface in RNS.Transport.interfaces)

    def check_alive(self) -> None:
        """Raise WireError(unreachable), tearing the Link down, once it is unusable."""
        if not self.link_usable():
            if self.link.status != RNS.Link.CLOSED:
                self.link.teardown()
            raise WireError(Code.UNREACHABLE, "the link to the peer is gone")

    def patience_s(self) -> float:
        """Seconds this Link's peer may go without acknowledging anything before
        it counts as gone: STALL_S (RADIO_STALL_S on a radio-class interface)
        or 10 RTTs, whichever is longer."""
        return max(RADIO_STALL_S if self.on_radio() else STALL_S, 10 * (self.link.rtt or 0))

    def wait_window(self) -> bool:
        """Block until the Channel can take a message. Returns False (after
        tearing the Link down) if the Link is unusable or the window stays shut
        for ``patience_s()`` seconds."""
        deadline = time.monotonic() + self.patience_s()
        while self.link_usable():
            if self.channel.is_ready_to_send():
                return True
            if time.monotonic() > deadline:
                break
            time.sleep(WINDOW_POLL_S)
        if self.link.status != RNS.Link.CLOSED:
            log.info("link %s unusable or stalled; tearing it down", self.link)
            self.link.teardown()
        return False

    def send(self, message: RNS.MessageBase) -> bool:
        """Send one message, waiting for the window. A message larger than the
        Link's Channel MDU is first shrunk by its ``fit(limit)`` (if it has one)
        and otherwise not sent: rns 0.9.4 would use up a sequence number on it
        and stall the Channel. Returns False if nothing was sent."""
        if len(message.pack()) > self.channel.mdu:
            fit = getattr(message, "fit", None)
            message = fit(self.channel.mdu) if fit else message
            if len(message.pack()) > self.channel.mdu:
                log.error("%s of %d bytes does not fit this link (MDU %d); not sent",
                          type(message).__name__, len(message.pack()), self.channel.mdu)
                return False
        while self.wait_window():
            try:
                self.channel.send(message)
                return True
            except ChannelException as e:
                if e.type != CEType.ME_LINK_NOT_READY:
                    log.error("channel refused %s: %s", type(message).__name__, e)
                    return False
                # another sender took the window between check and send
        return False

    def payload_limit(self, overhead: int) -> int:
        """Bytes of payload that fit one message with ``overhead`` bytes of own
        fields (follows the Link's negotiated MDU)."""
        return max(1, self.channel.mdu - overhead)
