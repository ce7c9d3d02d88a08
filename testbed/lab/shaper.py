"""A shaping relay in user space: rate, one-way delay, jitter, loss and MTU.

The kernel we run on has no ``netem`` qdisc, so the lab puts one of these
between two network namespaces. One relay process is one link:

- ``tcp``: accepts connections on ``listen`` and opens one to ``target`` for
  each; bytes go over in segments of at most ``mtu`` bytes. A lost segment is
  sent again after one round trip (TCP would retransmit it), so loss costs
  time and airtime, never data.
- ``udp``: datagrams sent to ``listen`` go to ``target``; datagrams sent to
  ``back_listen`` go to ``back_target``. A lost or oversized (> ``mtu``)
  datagram is gone, as a packet lost on a radio.

``half_duplex`` makes both directions share one air (a LoRa radio sends or
receives, never both), so airtime adds up across directions.

The relay writes its counters (bytes and packets per direction, lost,
too big) as JSON to ``stats`` while it runs. SIGUSR1 takes the link down
(everything sent meanwhile is lost; TCP segments wait) and SIGUSR2 brings it
back, so tests can cut a link without touching the processes on either end.

Run: ``python -m testbed.lab.shaper --mode udp --listen H:P --target H:P ...``.
"""

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass

from testbed.lab.running import serve_until_signalled

#: Most bytes a TCP direction may hold that have not gone on air yet (on top
#: of what is in flight); beyond this the relay stops reading, so the sender's
#: TCP feels the slow link.
TCP_BUFFER = 16384
#: The name of every thread a relay starts (so a test can find them).
THREAD_NAME = "lab-relay"
#: How often a waiting relay thread looks whether the relay was closed (seconds).
STOP_POLL_S = 0.2


@dataclass(frozen=True)
class Shape:
    """One link's character. ``rate_bps`` in bit/s (0 = unlimited), ``delay_s``
    one-way seconds, ``jitter_s`` up to this many extra seconds (uniform),
    ``loss`` a probability per packet (0..1), ``mtu`` bytes per packet."""
    rate_bps: int = 0
    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0
    mtu: int = 1500
    half_duplex: bool = False

    def __post_init__(self):
        if self.rate_bps < 0 or self.delay_s < 0 or self.jitter_s < 0 or not 0 <= self.loss < 1 or self.mtu < 64:
            raise ValueError(f"impossible link shape {self}")

    def airtime(self, nbytes):
        """Seconds ``nbytes`` take on air."""
        return nbytes * 8 / self.rate_bps if self.rate_bps else 0.0


class Air:
    """When each packet leaves: a packet waits until the air (of its direction,
    or the shared one) is free, then occupies it for its airtime."""

    def __init__(self, shape):
        self.shape = shape
        self._free_at = {}
        self._lock = threading.Lock()

    def transmit(self, direction, nbytes):
        """Seconds (monotonic) at which a packet of ``nbytes`` has left."""
        key = "air" if self.shape.half_duplex else direction
        with self._lock:
            start = max(time.monotonic(), self._free_at.get(key, 0.0))
            self._free_at[key] = start + self.shape.airtime(nbytes)
            return self._free_at[key]

    def lost(self):
        return self.shape.loss > 0 and random.random() < self.shape.loss

    def latency(self):
        return self.shape.delay_s + (random.uniform(0, self.shape.jitter_s) if self.shape.jitter_s else 0.0)


class Stats:
    """Counters, written as JSON to ``path`` (atomically, at most every 0.1 s)."""

    def __init__(self, path):
        self.path = path
        self.counts = {"bytes_ab": 0, "bytes_ba": 0, "packets_ab": 0, "packets_ba": 0,
                       "lost": 0, "too_big": 0, "connections": 0}
        self._lock = threading.Lock()
        self._dirty = threading.Event()

    def add(self, **counts):
        with self._lock:
            for key, value in counts.items():
                self.counts[key] = self.counts.get(key, 0) + value
        self._dirty.set()

    def writer(self, stop):
        while not stop.is_set():
            if self._dirty.wait(0.1):
                self._dirty.clear()
                self.flush()

    def flush(self):
        if not self.path:
            return
        with self._lock:
            text = json.dumps(self.counts)
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.path)


class Relay:
    """One shaped link (see the module docstring). ``up`` is cleared while the
    link is down."""

    def __init__(self, shape, stats_path=None):
        self.shape = shape
        self.air = Air(shape)
        self.stats = Stats(stats_path)
        self.up = threading.Event()
        self.up.set()
        self.stop = threading.Event()
        self._sockets = []

    def start_thread(self, target, *args):
        threading.Thread(target=target, args=args, name=THREAD_NAME, daemon=True).start()

    def close(self):
        self.stop.set()
        _shut(*self._sockets)  # wakes a thread blocked in accept or recv on a TCP socket
        for s in self._sockets:
            try:
                s.close()
            except OSError:
                pass
        self.stats.flush()

    # -- UDP ------------------------------------------------------------------

    def udp(self, listen, target, back_listen=None, back_target=None):
        """Relay datagrams ``listen`` -> ``target`` (and ``back_listen`` -> ``back_target``)."""
        pairs = [(listen, target, "ab")] + ([(back_listen, back_target, "ba")] if back_listen else [])
        for bind, dest, direction in pairs:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            # bursts wait in the relay's queue, never in a kernel buffer that drops them uncounted
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)
            sock.bind(bind)
            sock.settimeout(STOP_POLL_S)  # closing a socket does not wake a recv blocked on it
            self._sockets.append(sock)
            self.start_thread(self._udp_direction, sock, dest, direction)

    def _udp_direction(self, sock, dest, direction):
        out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        pipe = _Delivery(lambda data: out.sendto(data, dest), self.stop)
        while not self.stop.is_set():
            try:
                data = sock.recv(65535)
            except socket.timeout:
                continue
            except OSError:
                return
            if len(data) > self.shape.mtu:
                self.stats.add(too_big=1)
                continue
            sent_at = self.air.transmit(direction, len(data))
            self.stats.add(**{f"bytes_{direction}": len(data), f"packets_{direction}": 1})
            if not self.up.is_set() or self.air.lost():
                self.stats.add(lost=1)
                continue
            pipe.put(sent_at + self.air.latency(), data)

    # -- TCP ------------------------------------------------------------------

    def tcp(self, listen, target):
        """Accept on ``listen``; each connection is relayed to a new one to ``target``."""
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(listen)
        server.listen(16)
        self._sockets.append(server)
        self.start_thread(self._accept, server, target)

    def _accept(self, server, target):
        while not self.stop.is_set():
            try:
                client, _ = server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            self.stats.add(connections=1)
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._sockets.append(s)
            self.start_thread(self._tcp_direction, client, upstream, "ab")
            self.start_thread(self._tcp_direction, upstream, client, "ba")

    def _tcp_direction(self, src, dst, direction):
        pipe = _Delivery(dst.sendall, self.stop, on_error=lambda: _shut(src, dst))
        # bytes in flight (the bandwidth-delay product) do not count against the buffer
        in_flight = (self.shape.rate_bps or 10**9) / 8 * (self.shape.delay_s + self.shape.jitter_s)
        while not self.stop.is_set():
            pipe.wait_room(TCP_BUFFER + int(in_flight))
            try:
                data = src.recv(self.shape.mtu)
            except OSError:
                data = b""
            if not data:
                pipe.put(None, None)  # close after what is queued
                return
            self.up.wait()  # a link that is down holds segments back
            sent_at = self.air.transmit(direction, len(data))
            self.stats.add(**{f"bytes_{direction}": len(data), f"packets_{direction}": 1})
            while self.air.lost():  # sent again after a round trip, as TCP would
                self.stats.add(lost=1, **{f"bytes_{direction}": len(data)})
                sent_at = self.air.transmit(direction, len(data)) + 2 * self.shape.delay_s
            pipe.put(sent_at + self.air.latency(), data)


def _shut(*socks):
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Delivery:
    """Hands packets to ``send`` at their arrival times, in order (a link does
    not reorder: a packet never overtakes the one before it)."""

    def __init__(self, send, stop, on_error=None):
        self._send, self._stop, self._on_error = send, stop, on_error
        self._queue = deque()
        self._queued_bytes = 0
        self._last = 0.0
        self._cond = threading.Condition()
        threading.Thread(target=self._run, name=THREAD_NAME, daemon=True).start()

    def put(self, at, data):
        with self._cond:
            if at is not None:
                at = self._last = max(at, self._last)
                self._queued_bytes += len(data)
            self._queue.append((at, data))
            self._cond.notify_all()

    def wait_room(self, limit):
        with self._cond:
            while self._queued_bytes > limit and not self._stop.is_set():
                self._cond.wait(0.1)

    def _run(self):
        while not self._stop.is_set():
            with self._cond:
                while not self._queue and not self._stop.is_set():
                    self._cond.wait(0.1)
                if not self._queue:
                    return
                at, data = self._queue[0]
            if data is None:
                if self._on_error:
                    self._on_error()
                return
            pause = at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            try:
                self._send(data)
            except OSError:
                if self._on_error:
                    self._on_error()
                return
            with self._cond:
                self._queue.popleft()
                self._queued_bytes -= len(data)
                self._cond.notify_all()


def _hostport(text):
    host, _, port = text.rpartition(":")
    return host, int(port)


@contextlib.contextmanager
def tcp_relay(target, rate_bps, mtu=16384):
    """A ``tcp`` relay process on a free 127.0.0.1 port towards ``target``
    ("host:port"), at ``rate_bps`` bits/s in ``mtu``-byte segments; yields its
    address ("127.0.0.1:port") once it listens, and ends it afterwards."""
    from reticulum_grid.node.localgrid import free_port, wait_port
    from testbed.leftovers import end
    port = free_port()
    relay = subprocess.Popen([sys.executable, "-m", "testbed.lab.shaper", "--mode", "tcp", "--listen",
                              f"127.0.0.1:{port}", "--target", target, "--rate", str(rate_bps), "--mtu", str(mtu)])
    try:
        assert wait_port(port, 15), "the shaping relay did not listen"
        yield f"127.0.0.1:{port}"
    finally:
        end(relay)


def main(argv=None):
    p = argparse.ArgumentParser(description="A shaped link between two addresses (see testbed/lab/shaper.py).")
    p.add_argument("--mode", choices=("tcp", "udp"), required=True)
    p.add_argument("--listen", type=_hostport, required=True)
    p.add_argument("--target", type=_hostport, required=True)
    p.add_argument("--back-listen", type=_hostport, help="udp: the other direction's listen address")
    p.add_argument("--back-target", type=_hostport)
    p.add_argument("--rate", type=int, default=0, help="bit/s (0: unlimited)")
    p.add_argument("--delay", type=float, default=0.0, help="one-way delay, s")
    p.add_argument("--jitter", type=float, default=0.0, help="extra delay up to this, s")
    p.add_argument("--loss", type=float, default=0.0, help="probability a packet is lost")
    p.add_argument("--mtu", type=int, default=1500, help="bytes per packet")
    p.add_argument("--half-duplex", action="store_true")
    p.add_argument("--stats", help="write counters here as JSON")
    p.add_argument("--seed", type=int, help="random seed (loss, jitter)")
    a = p.parse_args(argv)
    if a.seed is not None:
        random.seed(a.seed)
    relay = Relay(Shape(a.rate, a.delay, a.jitter, a.loss, a.mtu, a.half_duplex), a.stats)
    if a.mode == "tcp":
        relay.tcp(a.listen, a.target)
    else:
        relay.udp(a.listen, a.target, a.back_listen, a.back_target)
    signal.signal(signal.SIGUSR1, lambda *_: relay.up.clear())
    signal.signal(signal.SIGUSR2, lambda *_: relay.up.set())
    relay.stats.flush()
    threading.Thread(target=relay.stats.writer, args=(relay.stop,), daemon=True).start()
    serve_until_signalled("ready", relay.stop)
    relay.close()


if __name__ == "__main__":
    main()
