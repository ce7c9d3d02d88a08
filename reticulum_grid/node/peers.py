"""Which local process is at the other end of a loopback TCP connection.

llama.cpp's RPC and torch's TCPStore have no authentication, so the grid
keeps them on 127.0.0.1. But every local user and process can reach a port
on 127.0.0.1: a listener that relays to such a service (the coordinator's
tunnel listener, a rank's store forwarder) accepts only connections whose
other end a given process owns, as the kernel tells it (psutil reads the
process's sockets from /proc, or the platform's equivalent).
"""

import ipaddress

import psutil


def _endpoint(address):
    """(host, port) with an IPv4-mapped IPv6 host ("::ffff:127.0.0.1") written as IPv4:
    a dual-stack client socket (torch's TCPStore makes them) reaching an IPv4 listener
    is listed by its owner as IPv6, and seen by the listener as IPv4."""
    host, port = tuple(address)[:2]
    try:
        mapped = ipaddress.ip_address(host.split("%")[0]).ipv4_mapped if ":" in host else None
    except ValueError:
        mapped = None
    return (str(mapped) if mapped else host, port)


def owned_by(sock, pids):
    """True when the connection ``sock`` (accepted on 127.0.0.1) was made from
    a socket that one of ``pids`` (process ids), or a child of one, holds.
    A process gone, not ours to inspect, or not a process id counts as not owning it."""
    try:
        peer, local = _endpoint(sock.getpeername()), _endpoint(sock.getsockname())
    except OSError:
        return False
    for process in _with_children(pids):
        try:
            for conn in process.net_connections(kind="tcp"):
                if conn.laddr and conn.raddr and _endpoint(conn.laddr) == peer and _endpoint(conn.raddr) == local:
                    return True
        except psutil.Error:
            continue
    return False


def _with_children(pids):
    out = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            out += [process, *process.children(recursive=True)]
        except (psutil.Error, ValueError, TypeError):  # gone, not ours, or not a process id
            continue
    return out
