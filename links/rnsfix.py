"""Version-guarded fixes for send-before-register races in RNS 0.9.4.

The grid pins rns==0.9.4 (the last MIT release). That release registers four
things *after* sending the packet that makes the peer answer; on a fast link
the answer can arrive first and is then lost:

1. ``Link.request`` sends the request packet and only then builds the
   ``RequestReceipt`` that appends itself to ``link.pending_requests``. A
   response handled in between finds no pending request and is dropped; the
   caller times out.  Fix: a per-link lock held across send-and-register, which
   ``Link.handle_response`` takes too, so a response waits the microseconds
   until its receipt exists.
2. ``Resource.__advertise_job`` sends the advertisement and only then calls
   ``link.register_outgoing_resource``. The receiver's first part request,
   arriving in between, matches no outgoing resource and is ignored; the
   transfer stalls until the receiver's retry (~3 s).  Fix: register the
   resource before the advertisement goes out.
3. ``Transport.outbound`` transmits a link packet (the broadcast branch every
   Link packet takes) and only then creates its ``PacketReceipt``. A delivery
   proof arriving in between matches no receipt and is dropped; a Channel
   then waits for a retry that the peer's duplicate filter may never answer,
   and a token stream freezes until generation ends.  Fix: create and
   register the receipt before ``outbound`` runs.
4. ``Channel.send`` sets its delivery callback on the receipt after the packet
   was sent. A proof validated in between never reaches the Channel: its
   window stops growing and the envelope stays in its ring (which lengthens
   every later timeout).  Fix: a delivery callback set on an already delivered
   receipt runs at once.

Besides the races, two more 0.9.4 defects are mended here:

- A TCP server's client interfaces are spawned with ingress control on,
  whatever the server's ``ingress_control`` says; from its second new
  destination on, a tower's announces are then held for minutes.  Fix: a
  spawned interface follows its parent's setting.
- ``Transport.jobs`` sends the packets it collected outside its try block: an
  announce that a transport node cannot re-send (app_data that fit one hop but
  not the two-address header, 318 bytes and up) raises there and ends the job
  loop thread for good, so the node stops forwarding announces and timing out
  receipts.  Fix: an exception in one round of jobs is logged and the loop goes on.
- ``TCPClientInterface.process_outgoing`` writes a frame with ``sendall`` and
  no lock. Several threads sending on one Link (streams, chunk transfers,
  delivery proofs) interleave their bytes once the socket buffer fills; the
  mangled frames fail their checks and are dropped, and every stream on that
  Link stalls behind the retransmission.  Fix: one write at a time per interface.
- ``Channel._update_packet_timeouts`` iterates the send ring
without the Channel's lock while the receive thread removes delivered
envelopes; "deque mutated during iteration" then escapes from
``Channel.send``.  Fix: take the lock there too.

``apply()`` is idempotent and patches nothing on any other RNS version.
``RNGRID_RNS_UNPATCHED`` in the environment leaves fixes out, to show that
each one is needed (``tests/wire/test_rnsfix_unpatched.py``): ``1`` or ``all``
leaves out every fix, a comma-separated list of names from ``FIXES`` only
those.
"""

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import RNS

AFFECTED_VERSIONS = ("0.9.4",)
#: Environment switch: "1" (or "all") starts RNS without any of these fixes,
#: "name,name" without the named ones (for tests).
UNPATCHED_ENV = "RNGRID_RNS_UNPATCHED"

_applied: bool | None = None  # after apply(): whether every fix is active
_guard = threading.Lock()


def applies_to(version: str | None = None) -> bool:
    """True when the running (or given) RNS version carries both races."""
    return (version or RNS.__version__) in AFFECTED_VERSIONS


def apply() -> bool:
    """Install the fixes if the running RNS is an affected version.

    Returns True when all of them are active after the call.
    """
    global _applied
    with _guard:
        if _applied is not None:
            return _applied
        if not applies_to():
            return False
        left_out = _left_out()
        if left_out:
            logging.getLogger("rngrid.rns").warning("%s: RNS %s runs without its fixes %s", UNPATCHED_ENV,
                                                    RNS.__version__, ", ".join(sorted(left_out)))
        for name, fix in FIXES.items():
            if name not in left_out:
                fix()
        _applied = not left_out
        return _applied


def _left_out() -> set[str]:
    """Names of the fixes the environment switch leaves out."""
    value = os.environ.get(UNPATCHED_ENV, "").strip()
    if value in ("1", "all"):
        return set(FIXES)
    names = {n.strip() for n in value.split(",") if n.strip()}
    unknown = names - set(FIXES)
    if unknown:
        raise ValueError(f"{UNPATCHED_ENV}: no fix named {', '.join(sorted(unknown))}; known: {', '.join(FIXES)}")
    return names


_guard_links = threading.Lock()


def _link_lock(link: RNS.Link) -> threading.RLock:
    lock = link.__dict__.get("_rngrid_request_lock")
    if lock is None:
        with _guard_links:
            lock = link.__dict__.setdefault("_rngrid_request_lock", threading.RLock())
    return lock


def _fix_request_reply_race() -> None:
    # Race 1 (see module docstring): response handled before RequestReceipt registered.
    original_request = RNS.Link.request
    original_handle_response = RNS.Link.handle_response

    def request(self: RNS.Link, *args: Any, **kwargs: Any) -> Any:
        with _link_lock(self):
            return original_request(self, *args, **kwargs)

    def handle_response(self: RNS.Link, *args: Any, **kwargs: Any) -> Any:
        with _link_lock(self):
            return original_handle_response(self, *args, **kwargs)

    request.__doc__ = original_request.__doc__
    RNS.Link.request = request
    RNS.Link.handle_response = handle_response


def _fix_resource_advertise_race() -> None:
    # Race 2 (see module docstring): part request arrives before the resource is registered.
    def advertise_job(self: RNS.Resource) -> None:
        self.advertisement_packet = RNS.Packet(
            self.link, RNS.ResourceAdvertisement(self).pack(), context=RNS.Packet.RESOURCE_ADV
        )
        while not self.link.ready_for_new_resource():
            self.status = RNS.Resource.QUEUED
            time.sleep(0.25)

        try:
            self.last_activity = time.time()
            self.started_transferring = self.last_activity
            self.adv_sent = self.last_activity
            self.rtt = None
            self.status = RNS.Resource.ADVERTISED
            self.retries_left = self.max_adv_retries
            self.link.register_outgoing_resource(self)
            self.advertisement_packet.send()
        except Exception as e:
            RNS.log("Could not advertise resource, the contained exception was: " + str(e), RNS.LOG_ERROR)
            self.cancel()
            return

        self.watchdog_job()

    RNS.Resource._Resource__advertise_job = advertise_job


def _wants_receipt(packet: RNS.Packet) -> bool:
    # Transport.outbound's own rule for which packets get a PacketReceipt.
    return (packet.create_receipt is True and packet.packet_type == RNS.Packet.DATA
            and packet.destination.type != RNS.Destination.PLAIN
            and not (RNS.Packet.KEEPALIVE <= packet.context <= RNS.Packet.LRPROOF)
            and not (RNS.Packet.RESOURCE <= packet.context <= RNS.Packet.RESOURCE_RCL))


def _fix_receipt_after_transmit_race() -> None:
    # Race 3 (see module docstring): proof handled before the receipt exists.
    original_outbound = RNS.Transport.outbound

    def outbound(packet: RNS.Packet) -> bool:
        if not _wants_receipt(packet):
            return original_outbound(packet)
        if not packet.packed:
            packet.pack()
        receipt = RNS.PacketReceipt(packet)
        RNS.Transport.receipts.append(receipt)
        packet.receipt = receipt
        packet.create_receipt = False
        try:
            sent = original_outbound(packet)
        finally:
            packet.create_receipt = True
        if not sent and receipt in RNS.Transport.receipts:
            RNS.Transport.receipts.remove(receipt)
        return sent

    RNS.Transport.outbound = staticmethod(outbound)


def _fix_late_delivery_callback_race() -> None:
    # Race 4 (see module docstring): delivery callback set after the proof arrived.
    original = RNS.PacketReceipt.set_delivery_callback

    def set_delivery_callback(self: RNS.PacketReceipt, callback: Callable[[Any], None] | None) -> None:
        original(self, callback)
        if callback is not None and self.status == RNS.PacketReceipt.DELIVERED:
            callback(self)

    RNS.PacketReceipt.set_delivery_callback = set_delivery_callback


def _fix_unlocked_ring_iteration() -> None:
    from RNS.Channel import Channel
    original = Channel._update_packet_timeouts

    def update_packet_timeouts(self: Any) -> Any:
        with self._lock:
            return original(self)

    Channel._update_packet_timeouts = update_packet_timeouts


def _fix_spawned_ingress_control() -> None:
    from RNS.Interfaces.Interface import Interface
    original = Interface.should_ingress_limit

    def should_ingress_limit(self: Any) -> bool:
        parent = getattr(self, "parent_interface", None)
        if parent is not None and not getattr(parent, "ingress_control", True):
            return False
        return original(self)

    Interface.should_ingress_limit = should_ingress_limit


def _fix_fatal_transport_jobs() -> None:
    original = RNS.Transport.jobs

    def jobs() -> None:
        try:
            original()
        except Exception as e:
            RNS.Transport.jobs_running = False
            RNS.log(f"A round of Transport jobs failed and was skipped: {e}", RNS.LOG_ERROR)

    RNS.Transport.jobs = staticmethod(jobs)


def _fix_interleaved_tcp_writes() -> None:
    from RNS.Interfaces.TCPInterface import TCPClientInterface
    original = TCPClientInterface.process_outgoing

    def process_outgoing(self: Any, data: bytes) -> Any:
        lock = self.__dict__.get("_rngrid_write_lock")
        if lock is None:
            with _guard_links:
                lock = self.__dict__.setdefault("_rngrid_write_lock", threading.Lock())
        with lock:
            return original(self, data)

    TCPClientInterface.process_outgoing = process_outgoing


#: Every fix by name, in the order they are applied.
FIXES: dict[str, Callable[[], None]] = {
    "request_reply": _fix_request_reply_race,
    "resource_advertise": _fix_resource_advertise_race,
    "receipt_after_transmit": _fix_receipt_after_transmit_race,
    "late_delivery_callback": _fix_late_delivery_callback_race,
    "ring_iteration": _fix_unlocked_ring_iteration,
    "spawned_ingress": _fix_spawned_ingress_control,
    "fatal_transport_jobs": _fix_fatal_transport_jobs,
    "interleaved_tcp_writes": _fix_interleaved_tcp_writes,
}
