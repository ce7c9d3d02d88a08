"""The network lab's shaping relay, on 127.0.0.1: rate, delay, loss, MTU,
half-duplex air and a link that goes down, each measured end to end. Upper
bounds on time allow what an unshaped relay takes for the same bytes in the
same run (a loaded machine slows both), and waits are for the packets
themselves, not for a fixed quiet time."""

import random
import socket
import threading
import time

import pytest

from testbed.lab.shaper import THREAD_NAME, Relay, Shape


def free_port(kind=socket.SOCK_STREAM):
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def relays():
    started = []
    yield lambda shape: started.append(Relay(shape)) or started[-1]
    for relay in started:
        relay.close()


def tcp_pair(relay):
    """(client socket, server-side socket) joined through ``relay``."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = free_port()
    relay.tcp(("127.0.0.1", port), server.getsockname())
    client = socket.create_connection(("127.0.0.1", port), timeout=5)
    far, _ = server.accept()
    server.close()
    far.settimeout(10)
    return client, far


def recv_exactly(sock, n):
    data = b""
    while len(data) < n:
        piece = sock.recv(n - len(data))
        assert piece, "connection closed early"
        data += piece
    return data


def timed_transfer(relay, payload):
    """(seconds for one byte, seconds for ``payload``) across ``relay``."""
    client, far = tcp_pair(relay)
    start = time.monotonic()
    client.sendall(b"x")
    recv_exactly(far, 1)
    one_way = time.monotonic() - start
    start = time.monotonic()
    client.sendall(payload)
    assert recv_exactly(far, len(payload)) == payload
    return one_way, time.monotonic() - start


def test_tcp_rate_and_delay(relays):
    payload = bytes(range(256)) * 40  # 10240 bytes: 1.02 s of air at 80 kbit/s
    base_one_way, base_elapsed = timed_transfer(relays(Shape(mtu=500)), payload)  # the relay's own cost here
    # A delay long enough that once and twice stay apart on a loaded machine (a thread may wake late).
    relay = relays(Shape(rate_bps=80_000, delay_s=1.0, mtu=500))
    one_way, elapsed = timed_transfer(relay, payload)
    print(f"one byte {one_way:.3f} s (unshaped {base_one_way:.3f}), 10 KiB {elapsed:.3f} s (unshaped {base_elapsed:.3f})")
    assert 1.0 <= one_way < 2 * 1.0 + base_one_way, one_way  # the delay once, not twice
    # The air time plus one delay; a per-segment delay (21 segments) would be 20 s more.
    assert 1.02 + 1.0 <= elapsed < 1.02 + 1.0 + 10 + base_elapsed, elapsed
    assert relay.stats.counts["bytes_ab"] == len(payload) + 1
    assert relay.stats.counts["packets_ab"] >= len(payload) // 500


def test_tcp_loss_costs_time_not_data(relays):
    relay = relays(Shape(rate_bps=0, delay_s=0.05, loss=0.3, mtu=200))
    client, far = tcp_pair(relay)
    payload = b"abcdefgh" * 250  # 10 segments of 200 bytes
    start = time.monotonic()
    client.sendall(payload)
    assert recv_exactly(far, len(payload)) == payload
    assert relay.stats.counts["lost"] > 0
    assert time.monotonic() - start >= 0.05 + 2 * 0.05  # at least one resend waited a round trip


def udp_link(relay, back=False):
    """(sender socket to the relay, receiving socket) through ``relay``."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)  # holds all 300 until drained
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(0.5)
    port = free_port(socket.SOCK_DGRAM)
    relay.udp(("127.0.0.1", port), rx.getsockname())
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.connect(("127.0.0.1", port))
    return tx, rx


def drain(rx, count=None, timeout=30.0):
    """Datagrams on ``rx``: ``count`` of them (waiting up to ``timeout`` seconds
    for them), or with ``count`` None whatever comes until a 0.5 s silence."""
    got, deadline = [], time.monotonic() + timeout
    try:
        while count is None or len(got) < count:
            rx.settimeout(0.5 if count is None else max(0.01, deadline - time.monotonic()))
            got.append(rx.recv(65535))
    except socket.timeout:
        pass
    return got


def settled(relay, total, timeout=30.0):
    """Wait until the relay has taken all ``total`` datagrams (forwarded, lost or too big)."""
    deadline = time.monotonic() + timeout
    counts = relay.stats.counts
    while counts["packets_ab"] + counts["too_big"] < total and time.monotonic() < deadline:
        time.sleep(0.05)
    return counts["packets_ab"] + counts["too_big"] == total


def test_udp_loss_and_mtu(relays):
    random.seed(7)
    relay = relays(Shape(loss=0.2, mtu=500))
    tx, rx = udp_link(relay)
    for i in range(300):
        tx.send(i.to_bytes(2, "big") * 100)  # 200 bytes
        time.sleep(0.001)  # no socket buffer overflows: every loss is the relay's
    tx.send(b"y" * 501)
    assert settled(relay, 301), relay.stats.counts
    got = drain(rx, count=300 - relay.stats.counts["lost"])
    assert 200 <= len(got) <= 280, len(got)  # ~240 of 300 arrive
    assert all(len(d) == 200 for d in got)  # the 501-byte datagram never does
    seq = [int.from_bytes(d[:2], "big") for d in got]
    assert seq == sorted(seq)  # nothing overtakes
    assert relay.stats.counts["too_big"] == 1 and relay.stats.counts["lost"] == 300 - len(got)


def test_half_duplex_directions_share_the_air(relays):
    shape = Shape(rate_bps=40_000, mtu=500, half_duplex=True)
    relay = relays(shape)
    rx_a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx_a.bind(("127.0.0.1", 0))
    rx_b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx_b.bind(("127.0.0.1", 0))
    pa, pb = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_DGRAM)
    relay.udp(("127.0.0.1", pa), rx_b.getsockname(), ("127.0.0.1", pb), rx_a.getsockname())
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    start = time.monotonic()
    for _ in range(5):  # 5 x 500 bytes each way: 0.5 s of air per direction, 1 s shared
        tx.sendto(b"a" * 500, ("127.0.0.1", pa))
        tx.sendto(b"b" * 500, ("127.0.0.1", pb))
    for rx in (rx_a, rx_b):
        rx.settimeout(3)
        for _ in range(5):
            rx.recv(1000)
    assert time.monotonic() - start >= 0.95


def test_link_down_loses_packets_until_up(relays):
    relay = relays(Shape())
    tx, rx = udp_link(relay)
    relay.up.clear()
    tx.send(b"during")
    assert settled(relay, 1) and relay.stats.counts["lost"] == 1, relay.stats.counts  # taken, and lost
    relay.up.set()
    tx.send(b"after")
    assert drain(rx, count=1) == [b"after"]
    assert drain(rx) == [], "nothing sent while the link was down arrives later"


def test_impossible_shapes_are_refused():
    for bad in ({"loss": 1.0}, {"mtu": 10}, {"rate_bps": -1}):
        with pytest.raises(ValueError):
            Shape(**bad)


@pytest.mark.parametrize("mode", ["udp", "tcp"])
def test_relay_stops_its_threads(relays, mode):
    # Only the relay's own threads count: the test process runs RNS and towers' clients too.
    before = set(threading.enumerate())

    def relay_threads():
        return [t for t in threading.enumerate() if t.name == THREAD_NAME and t not in before and t.is_alive()]

    relay = relays(Shape(delay_s=0.01))
    if mode == "udp":
        tx, rx = udp_link(relay)
        tx.send(b"x")
        assert drain(rx, count=1) == [b"x"]
    else:
        a, b = tcp_pair(relay)
        a.sendall(b"x")
        assert b.recv(1) == b"x"
    assert relay_threads(), "the relay runs threads of its own"
    relay.close()
    deadline = time.monotonic() + 15
    while relay_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not relay_threads()
