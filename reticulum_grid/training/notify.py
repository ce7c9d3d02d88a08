"""LXMF messaging: towers notify job owners, clients read them (``rngrid inbox``).

Pinned lxmf 0.6.3 on rns 0.9.4 reaches only LXMF clients on the same stack
(AES-128 links; see docs/licensing.md). Two 0.6.3 quirks handled here: it replaces the
process's SIGINT/SIGTERM handlers (we put ours back), and it skips a newly
queued outbound message until its 4 s job loop, so ``process_outbound()`` is
called right after ``handle_outbound()`` (~3 ms instead of up to 4 s).

A message to a recipient with no path goes to the tower's own propagation
node when it runs one (the recipient collects it later with
``rngrid inbox --from TOWER``); otherwise it waits in memory (lost if the
tower restarts) and is sent when the recipient announces itself, as
``rngrid inbox`` does.
"""

import logging
import math
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import msgpack
import RNS

from links.wire import json_safe

log = logging.getLogger("rngrid.notify")

PATH_WAIT_S = 8.0
MAX_WAITING = 64  # notifications kept in memory per offline recipient; the oldest go first


#: What ``rngrid inbox`` shows of a message (see inbox_entry).
InboxEntry = dict[str, Any]
#: A notification waiting for its recipient: (key, title, content, fields, public key).
Waiting = tuple[Hashable, str, str, dict[Any, Any], bytes | None]


def _router(identity: RNS.Identity, storage: str | os.PathLike[str]) -> Any:
    import LXMF
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    router = LXMF.LXMRouter(identity=identity, storagepath=str(storage))
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    return router


def delivery_hash(identity: RNS.Identity) -> bytes:
    """The LXMF delivery address (16 bytes) of an identity."""
    return RNS.Destination.hash(identity, "lxmf", "delivery")


def propagation_hash(identity: RNS.Identity) -> bytes:
    return RNS.Destination.hash(identity, "lxmf", "propagation")


class Notifier:
    """A tower's LXMF sender. ``send`` returns at once; ``on_delivered(key)`` runs
    when a message was delivered or stored on the propagation node."""

    def __init__(self, identity: RNS.Identity, storage: str | os.PathLike[str], display_name: str,
                 propagation_node: bool = False, on_delivered: Callable[[Hashable], None] | None = None) -> None:
        import LXMF
        self.LXMF = LXMF
        Path(storage).mkdir(parents=True, exist_ok=True)
        self.router = _router(identity, storage)
        self.source = self.router.register_delivery_identity(identity, display_name=display_name)
        self.propagation = propagation_node
        if propagation_node:
            self.router.enable_propagation()
        self.on_delivered = on_delivered
        self._pending: dict[bytes, list[Waiting]] = {}
        self._lock = threading.Lock()
        # RNS registers a handler only if it already has its aspect_filter.
        self.aspect_filter = "lxmf.delivery"
        RNS.Transport.register_announce_handler(self)
        self.router.announce(self.source.hash)

    def send(self, key: Hashable, destination_hash: bytes, title: str, content: str,
             fields: dict[Any, Any] | None = None, public_key: bytes | None = None) -> None:
        """Send (in the background) a message to ``destination_hash``; ``public_key``
        lets us address an identity whose announce we have not heard."""
        threading.Thread(target=self._send, args=(key, destination_hash, title, content, fields or {}, public_key),
                         name="rngrid-notify", daemon=True).start()

    def _send(self, key: Hashable, destination_hash: bytes, title: str, content: str, fields: dict[Any, Any],
              public_key: bytes | None) -> None:
        identity = self._identity(destination_hash, public_key)
        if identity is None or not self._path(destination_hash):
            if self.propagation and identity is not None:
                self._store_for_pickup(key, identity, title, content, fields)
            else:
                self._wait(destination_hash, (key, title, content, fields, public_key))
                log.info("no path to %s; notification waits for its announce", destination_hash.hex())
            return
        destination = RNS.Destination(identity, RNS.Destination.OUT, RNS.Destination.SINGLE, "lxmf", "delivery")
        message = self.LXMF.LXMessage(destination, self.source, content, title, fields,
                                      desired_method=self.LXMF.LXMessage.DIRECT)
        message.try_propagation_on_fail = False
        message.register_delivery_callback(lambda m: self._delivered(key))
        message.register_failed_callback(lambda m: self._failed(key, identity, title, content, fields))
        self.router.handle_outbound(message)
        self.router.process_outbound()
        log.info("notification to %s handed to LXMF for direct delivery", destination_hash.hex())

    def _identity(self, destination_hash: bytes, public_key: bytes | None) -> RNS.Identity | None:
        if public_key:
            identity = RNS.Identity(create_keys=False)
            identity.load_public_key(public_key)
            if delivery_hash(identity) == destination_hash:
                return identity
        if RNS.Identity.recall(destination_hash) is None:
            self._path(destination_hash)
        return RNS.Identity.recall(destination_hash)

    @staticmethod
    def _path(destination_hash: bytes) -> bool:
        if not RNS.Transport.has_path(destination_hash):
            RNS.Transport.request_path(destination_hash)
            deadline = time.monotonic() + PATH_WAIT_S
            while not RNS.Transport.has_path(destination_hash) and time.monotonic() < deadline:
                time.sleep(0.1)
        return RNS.Transport.has_path(destination_hash)

    def _store_for_pickup(self, key: Hashable, identity: RNS.Identity, title: str, content: str,
                          fields: dict[Any, Any]) -> None:
        destination = RNS.Destination(identity, RNS.Destination.OUT, RNS.Destination.SINGLE, "lxmf", "delivery")
        message = self.LXMF.LXMessage(destination, self.source, content, title, fields,
                                      desired_method=self.LXMF.LXMessage.PROPAGATED)
        message.pack()
        for lxmf_data in msgpack.unpackb(message.propagation_packed)[1]:
            self.router.lxmf_propagation(lxmf_data)
        log.info("notification for %s stored on this tower's propagation node", destination.hash.hex())
        self._delivered(key)

    def _delivered(self, key: Hashable) -> None:
        if self.on_delivered:
            self.on_delivered(key)

    def _failed(self, key: Hashable, identity: RNS.Identity, title: str, content: str,
                fields: dict[Any, Any]) -> None:
        if self.propagation:
            self._store_for_pickup(key, identity, title, content, fields)
        else:
            self._wait(delivery_hash(identity), (key, title, content, fields, identity.get_public_key()))

    def _wait(self, destination_hash: bytes, message: Waiting) -> None:
        with self._lock:
            waiting = self._pending.setdefault(destination_hash, [])
            waiting.append(message)
            del waiting[:-MAX_WAITING]

    # RNS announce handler: a recipient came back; send what waits for it.
    def received_announce(self, destination_hash: bytes, announced_identity: RNS.Identity,
                          app_data: bytes | None) -> None:
        with self._lock:
            waiting = self._pending.pop(destination_hash, [])
        if waiting:
            log.info("%s announced itself; sending %d waiting notification(s)", destination_hash.hex(), len(waiting))
        for key, title, content, fields, public_key in waiting:
            self.send(key, destination_hash, title, content, fields, public_key)


class Inbox:
    """A client's LXMF delivery destination; ``messages`` is a queue of received
    messages as dicts (title, content, fields, source, timestamp)."""

    def __init__(self, identity: RNS.Identity, storage: str | os.PathLike[str], display_name: str = "rngrid") -> None:
        Path(storage).mkdir(parents=True, exist_ok=True)
        self.router = _router(identity, storage)
        self.identity = identity
        self.destination = self.router.register_delivery_identity(identity, display_name=display_name)
        self.messages: queue.Queue[InboxEntry] = queue.Queue()
        self.router.register_delivery_callback(self._received)
        self.router.announce(self.destination.hash)

    def _received(self, message: Any) -> None:
        self.messages.put(inbox_entry(message.title, message.content, message.fields, message.source_hash,
                                      message.timestamp))

    def sync_from(self, tower_identity: RNS.Identity, timeout: float = 30.0) -> bool:
        """Collect messages waiting on a tower's propagation node. Returns when done or after ``timeout``."""
        node = propagation_hash(tower_identity)
        self.router.set_outbound_propagation_node(node)
        self.router.request_messages_from_propagation_node(self.identity)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.router.propagation_transfer_state >= self.router.PR_COMPLETE:
                return self.router.propagation_transfer_state == self.router.PR_COMPLETE
            time.sleep(0.1)
        return False


def inbox_entry(title: object, content: object, fields: object, source_hash: object,
                timestamp: object) -> InboxEntry:
    """A received message as a map JSON can carry whatever the sender put in
    it: title and content as text (bytes that are not UTF-8 replaced), fields
    with bytes as hex and values JSON lacks as text, the source hash as hex,
    the timestamp in seconds (None when it is not a finite number)."""
    return {"title": _text(title), "content": _text(content), "fields": json_safe(fields),
            "source": bytes(source_hash).hex() if isinstance(source_hash, (bytes, bytearray)) else "",
            "timestamp": _seconds(timestamp)}


def _text(value: object) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    return value if isinstance(value, str) else ""


def _seconds(value: object) -> int | float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if isinstance(value, float) and not math.isfinite(value) else value
