"""The rns 0.9.4 send-before-register races, exercised with many fast round trips.

Race 1: a response arriving before its RequestReceipt is registered is dropped
(the request times out). Race 2: a Resource whose advertisement is answered
before it is registered stalls until the receiver retries (~3 s). Races 3 and
4: a Channel message's delivery proof arriving before its PacketReceipt or the
Channel's delivery callback exists is lost, so the message is resent or its
envelope stays in the ring. Each test fails on unpatched 0.9.4:
tests/wire/test_rnsfix_unpatched.py runs them again with RNGRID_RNS_UNPATCHED naming the fix."""

import logging
import threading
import time

import pytest
import RNS

from links import rnsfix
from reticulum_grid.node.connection import open_link
from tests.wire import echo_server


def test_fix_is_version_guarded():
    assert rnsfix.applies_to("0.9.4")
    assert not rnsfix.applies_to("0.9.5") and not rnsfix.applies_to("1.0.0")
    assert rnsfix.apply() is True  # RNS here is the pinned 0.9.4 (and RNGRID_RNS_UNPATCHED is not set)


@pytest.fixture(scope="module")
def echo_link(hub, tmp_path_factory):
    proc, destination = echo_server.spawn(tmp_path_factory.mktemp("echo"), hub.address)
    try:
        link = open_link(destination, "rngridtest", "echo", timeout=30)
        yield link
        link.teardown()
    finally:
        proc.kill()
        proc.wait(5)


def round_trip(link, path, data, timeout):
    done, box = threading.Event(), {}
    receipt = link.request(path, data, timeout=timeout,
                           response_callback=lambda r: (box.setdefault("r", r.response), done.set()),
                           failed_callback=lambda r: done.set())
    assert receipt
    done.wait(timeout + 1)
    return box.get("r")


def pause_after_transmit(monkeypatch, pausing):
    """Every packet RNS transmits is followed by a 2 ms pause of the sending thread
    when ``pausing()`` is true there: on loopback the peer's reply or proof then
    beats whatever the sender registers after the transmit."""
    transmit = RNS.Transport.transmit

    def transmit_then_pause(interface, raw):
        transmit(interface, raw)
        if pausing():
            time.sleep(0.002)

    monkeypatch.setattr(RNS.Transport, "transmit", staticmethod(transmit_then_pause))


def test_many_fast_request_round_trips_lose_no_reply(echo_link, monkeypatch):
    # Four threads keep the link busy so replies race their receipts' registration.
    # Each pauses right after its packet leaves (as a thread does when it loses
    # the GIL there), so on loopback the reply reliably beats the receipt when
    # nothing holds it back; without the pause the race is rarely lost here.
    workers = set()
    pause_after_transmit(monkeypatch, lambda: threading.current_thread() in workers)
    lost = []

    def worker(k):
        for i in range(150):
            if lost:  # one lost reply is the symptom: each more costs its whole timeout
                return
            payload = bytes([k]) + i.to_bytes(4, "big")
            # A reply lost to the race never comes; one slowed by a loaded machine comes well within this.
            if round_trip(echo_link, "echo", payload, timeout=10) != payload:
                lost.append(payload)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    workers.update(threads)
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not lost, f"{len(lost)} of 600 replies lost"


def test_resource_responses_need_no_retry(echo_link, monkeypatch, caplog):
    # Each 256 KiB response exceeds the link MDU and travels as a Resource. A part
    # request lost to the race shows up as RNS's own retry log lines.
    monkeypatch.setattr(RNS, "loglevel", RNS.LOG_DEBUG)
    caplog.set_level(logging.DEBUG, logger="rngrid.rns")
    for i in range(25):
        assert round_trip(echo_link, "big", bytes([i]) * 8, timeout=30) == bytes([i]) * 8 * 32768
        retries = [r.getMessage() for r in caplog.records if "requesting retry" in r.getMessage()
                   or "retrying resource advertisement" in r.getMessage()]
        assert not retries, f"round trip {i}: {retries}"  # at the first stall: without the fix each costs ~3 s


def test_channel_messages_need_no_resend(echo_link, monkeypatch):
    from links.channel import ChannelRouter
    from tests.wire.echo_server import Echo

    # Pause the sending thread right after each packet leaves, as a busy tower's
    # generation thread does by holding the GIL: the echo server's proof then
    # arrives before anything registered after the transmit exists.
    sender = threading.current_thread()
    pause_after_transmit(monkeypatch, lambda: threading.current_thread() is sender)
    resends = []
    resend = RNS.Packet.resend
    monkeypatch.setattr(RNS.Packet, "resend", lambda self: (resends.append(1), resend(self))[1])
    router = ChannelRouter(echo_link)
    # A proof lost to the race never comes, so its message is resent whatever the
    # timeout; a proof a loaded machine delays by a few hundred ms must not count.
    # RNS's own timeout here is ~25 ms times the ring's length (loopback RTT).
    timeout_of = router.channel._get_packet_timeout_time
    monkeypatch.setattr(router.channel, "_get_packet_timeout_time", lambda tries: max(timeout_of(tries), 2.0))
    echoed = threading.Semaphore(0)
    router.on(Echo, lambda message: echoed.release())
    total = 600
    for i in range(total):
        assert router.send(Echo(i.to_bytes(4, "big")))
        assert not resends, f"message {i}: {len(resends)} resent"  # stop at the first: each costs a timeout
    assert all(echoed.acquire(timeout=30) for _ in range(total)), "not every message came back"
    deadline = time.monotonic() + 30
    while router.channel._tx_ring and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not resends, f"{len(resends)} of {total} messages had to be resent"
    assert not router.channel._tx_ring, f"{len(router.channel._tx_ring)} delivered envelopes stuck in the ring"


class OutletDouble:
    """Test double for a Channel outlet: a fast link that is always usable."""
    rtt = 0.001
    mdu = 400
    is_usable = True


def test_channel_ring_iteration_is_locked():
    from RNS.Channel import Channel

    rnsfix.apply()
    channel = Channel(OutletDouble())
    envelope = type("EnvelopeDouble", (), {"tries": 1, "packet": None})
    stop, errors = threading.Event(), []

    def mutate():
        while not stop.is_set():
            with channel._lock:
                channel._tx_ring.append(envelope())
                if len(channel._tx_ring) > 50:
                    channel._tx_ring.clear()

    thread = threading.Thread(target=mutate)
    thread.start()
    try:  # a race: unpatched it usually breaks within thousands of rounds, give it 3 s
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            channel._update_packet_timeouts()
    except RuntimeError as e:
        errors.append(e)
    finally:
        stop.set()
        thread.join()
    assert not errors


def test_spawned_interfaces_follow_their_servers_ingress_control():
    from RNS.Interfaces.Interface import Interface

    rnsfix.apply()
    server, spawned = Interface(), Interface()
    server.ingress_control = False
    spawned.parent_interface = server  # ingress_control stays True, as 0.9.4 spawns it
    for _ in range(Interface.IA_FREQ_SAMPLES):
        spawned.received_announce()  # a burst of announces from new destinations
    assert spawned.should_ingress_limit() is False
    server.ingress_control = True
    assert spawned.should_ingress_limit() is True


class SlowSocketDouble:
    """Test double for a TCP socket under backpressure: sendall writes a few
    bytes at a time and lets other threads run in between, as a full kernel
    send buffer does."""

    def __init__(self):
        self.wire = bytearray()

    def sendall(self, data):
        for i in range(0, len(data), 7):
            self.wire += data[i:i + 7]
            time.sleep(0)


def test_concurrent_writes_on_one_tcp_interface_stay_whole_frames():
    from RNS.Interfaces.TCPInterface import HDLC, TCPClientInterface

    rnsfix.apply()
    interface = object.__new__(TCPClientInterface)  # no connection: only the write path is exercised
    interface.online, interface.detached, interface.kiss_framing = True, False, False
    interface.writing, interface.txb, interface.parent_interface = False, 0, None
    interface.socket = SlowSocketDouble()
    frames = [bytes([k]) * 300 for k in range(1, 9)]
    threads = [threading.Thread(target=lambda f=f: [interface.process_outgoing(f) for _ in range(20)])
               for f in frames]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    received = [bytes(part) for part in bytes(interface.socket.wire).split(bytes([HDLC.FLAG])) if part]
    assert len(received) == 160 and set(received) == set(frames), "frames were interleaved on the wire"
