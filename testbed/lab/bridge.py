"""A shaping Ethernet bridge in user space: hosts on one link, with rate, delay, jitter and loss.

The kernel here has no ``netem`` qdisc. The relay (shaper.py) shapes what it
relays, but a relayed connection comes from the relay's address; services
that check who connects (a data-plane front admits one peer address) need the
peer's own address. So for a link between towers the lab puts this bridge
in a namespace of its own with one veth pair per host: every frame arriving
on one side (an AF_PACKET socket) waits its airtime at the link's rate and
its one-way delay, is dropped with the link's loss, and goes out the side of
the host it is addressed to (learned from the source addresses of the frames
each side sent, as a switch learns; a broadcast or a destination not seen
yet goes out every other side). Each pair of sides is a link of its own (its
air per direction), as if each host had its own cable to the others. All
hosts share one subnet and see each other's real addresses, and TCP between
them behaves as on a LAN or tailnet (a lost frame costs a retransmission).
Large segments are avoided at the source: the lab sets the hosts' veths to
segments of one MTU (``gso_max_size``).

Run: ``python -m testbed.lab.bridge --a IFNAME --b IFNAME [--c IFNAME] --rate BPS --delay S ...``
(in the bridge's namespace; it writes counters as JSON to ``--stats``: bytes
and packets per direction, ``ab`` from side a to side b and so on).
"""

import argparse
import heapq
import random
import socket
import threading
import time

from testbed.lab.running import serve_until_signalled
from testbed.lab.shaper import Air, Shape, Stats

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4


class Side:
    """One of the bridge's interfaces: frames in, frames out."""

    def __init__(self, ifname, letter):
        self.letter = letter
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.bind((ifname, 0))
        self.queue = []  # (departure, seq, frame) heap of frames to send out of this side
        self.cond = threading.Condition()


def forward(source, sides, hosts, air, stats, stop, seq):
    """Frames arriving on ``source`` go into the queue of the side their
    destination was seen on (``hosts``: {MAC: side}), or of every other side, shaped."""
    while not stop.is_set():
        try:
            frame, address = source.sock.recvfrom(1 << 16)
        except OSError:
            return
        if address[2] == PACKET_OUTGOING or len(frame) < 14:
            continue  # our own send on this side
        hosts[frame[6:12]] = source
        known = hosts.get(frame[0:6])
        for dest in [known] if known is not None and known is not source else [s for s in sides if s is not source]:
            direction = source.letter + dest.letter
            if air.lost():
                stats.add(lost=1)
                continue
            leaves = air.transmit(direction, len(frame)) + air.latency()
            with dest.cond:
                heapq.heappush(dest.queue, (leaves, next(seq), frame))
                dest.cond.notify()
            stats.add(**{f"bytes_{direction}": len(frame), f"packets_{direction}": 1})


def send(side, stop):
    """Send ``side``'s queued frames when their time comes."""
    while not stop.is_set():
        with side.cond:
            while not side.queue and not stop.is_set():
                side.cond.wait(0.2)
            if stop.is_set():
                return
            leaves, _, frame = side.queue[0]
            wait = leaves - time.monotonic()
            if wait > 0:
                side.cond.wait(min(wait, 0.2))
                continue
            heapq.heappop(side.queue)
        try:
            side.sock.send(frame)
        except OSError:
            pass


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--c", default="", help="a third host's side")
    ap.add_argument("--rate", type=int, default=0, help="bit/s, 0 = unlimited")
    ap.add_argument("--delay", type=float, default=0.0, help="one-way seconds")
    ap.add_argument("--jitter", type=float, default=0.0)
    ap.add_argument("--loss", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stats", default="")
    args = ap.parse_args(argv)
    random.seed(args.seed)
    air = Air(Shape(args.rate, args.delay, args.jitter, args.loss, 9000))
    stats, stop = Stats(args.stats), threading.Event()
    sides = [Side(ifname, letter) for ifname, letter in ((args.a, "a"), (args.b, "b"), (args.c, "c")) if ifname]
    hosts = {}
    seq = iter(range(1 << 62))
    threads = [threading.Thread(target=forward, args=(side, sides, hosts, air, stats, stop, seq), daemon=True)
               for side in sides]
    threads += [threading.Thread(target=send, args=(side, stop), daemon=True) for side in sides]
    threads.append(threading.Thread(target=stats.writer, args=(stop,), daemon=True))
    for t in threads:
        t.start()
    serve_until_signalled("ready", stop)
    stats.flush()


if __name__ == "__main__":
    main()
