"""Which local process is at the other end of a loopback TCP connection.

llama.cpp's RPC and torch's TCPStore have no authentication, so the grid
keeps them on 127.0.0.1. But every local user and process can reach a port
on 127.0.0.1: a listener that relays to such a service (the coordinator's
tunnel listener, a rank's store forwarder) accepts only connections whose
other end a given process owns, as the kernel tells it (psutil reads the
process's sockets from /proc, or the platform's equivalent).
"""

import ipaddress
import socket
from collections.abc import Iterable

import psutil


def same_address(a: str, b: str) -> bool:
    """True when IP addresses ``a`` and ``b`` (text) are one: an IPv6 socket
    shows an IPv4 peer as ``::ffff:a.b.c.d`` (torch's TCPStore client does)."""
    return plain_ip(a) == plain_ip(b)


def plain_ip(text: object) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """``text`` as an ipaddress object, an IPv4-mapped IPv6 address as its IPv4 one. Raises ValueError."""
    address = ipaddress.ip_address(str(text).split("%")[0])
    return getattr(address, "ipv4_mapped", None) or address


def owned_by(sock: socket.socket, pids: Iterable[int]) -> bool:
    """True when the connection ``sock`` (accepted on 127.0.0.1) was made from
    a socket that one of ``pids`` (process ids), or a child of one, holds.
    A process gone, not ours to inspect, or not a process id counts as not owning it."""
    try:
        peer, local = sock.getpeername()[:2], sock.getsockname()[:2]
    except OSError:
        return False
    for process in _with_children(pids):
        try:
            for conn in process.net_connections(kind="tcp"):
                if (conn.laddr and conn.raddr and conn.laddr[1] == peer[1] and conn.raddr[1] == local[1]
                        and same_address(conn.laddr[0], peer[0]) and same_address(conn.raddr[0], local[0])):
                    return True
        except (psutil.Error, ValueError):
            continue
    return False


def _with_children(pids: Iterable[int]) -> list[psutil.Process]:
    out: list[psutil.Process] = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            out += [process, *process.children(recursive=True)]
        except (psutil.Error, ValueError, TypeError):  # gone, not ours, or not a process id
            continue
    return out
