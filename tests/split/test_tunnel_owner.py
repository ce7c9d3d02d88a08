"""The coordinator's tunnel listener (split/tunnel.py) carries only its own
split model's connections: any other local process that reaches its port on
127.0.0.1 is closed before a byte crosses the Link to the worker tower, whose
RPC server trusts whatever arrives.

Real processes: a tower on the hub, a real RNS Link to it, the listener in
this process, and connections made by this process (the owner here) and by a
child process (another local user or program)."""

import socket
import subprocess
import sys
import time

import pytest
import RNS

from reticulum_grid.node.connection import TowerConnection
from reticulum_grid.split.tunnel import TunnelListener, Tunnels
from testbed.requirements import need

#: Connects to the listener, sends a line, prints "closed" or "open" (what the listener did), then waits.
CONNECT = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
s.sendall(b"HELLO over the tunnel")
try:
    print("closed" if s.recv(64) == b"" else "open", flush=True)
except socket.timeout:
    print("open", flush=True)
except ConnectionResetError:
    print("closed", flush=True)
sys.stdin.readline()
"""


def connect(port):
    """A child process connected to ``port``; (process, what it saw)."""
    proc = subprocess.Popen([sys.executable, "-c", CONNECT, str(port)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()


@pytest.fixture(scope="module")
def link(hub):
    tower = hub.start_tower("tunnel-peer", models={})
    conn = TowerConnection(RNS.Identity(), hub.wait_tower(tower.name).destination_hash, "tunnel-peer")
    conn.ensure_link(30)
    yield conn
    conn.close()
    tower.stop()


def test_only_the_owning_process_gets_through(link):
    tunnels = Tunnels(link.router)
    owner = {}
    listener = TunnelListener(tunnels, owners=lambda: [owner["pid"]] if owner else [])
    port = int(listener.endpoint.rsplit(":", 1)[1])
    procs = []
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # this process: not the split model
            s.sendall(b"ALLOC_BUFFER")
            try:
                assert s.recv(64) == b""
            except ConnectionResetError:  # closed with our bytes unread
                pass
        owner["pid"] = -1  # a split model is starting; another local program connects first
        intruder, seen = connect(port)
        procs.append(intruder)
        assert seen == "closed"
        assert listener.refused == 2 and tunnels.pipes == {} and tunnels.sent_bytes == 0
        # The split model's own connection (llama.cpp's RPC client in it).
        split_model = subprocess.Popen([sys.executable, "-c", CONNECT, str(port)], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True)
        owner["pid"] = split_model.pid  # known as soon as it is spawned, before it can connect
        procs.append(split_model)
        assert split_model.stdout.readline().strip() == "open"
        deadline = time.monotonic() + 10
        while tunnels.sent_bytes == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tunnels.sent_bytes > 0 and listener.refused == 2
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(5)
        listener.close()


def test_a_dual_stack_client_is_known_by_its_ipv4_address():
    """torch's TCPStore connects with an IPv6 socket to ::ffff:127.0.0.1: the
    owner lists it as IPv6, the IPv4 listener sees 127.0.0.1; it is still ours
    (seen refused, every rank's store connection, before node/socket_owner.py mapped them)."""
    import os

    from reticulum_grid.node.socket_owner import owned_by
    need("ipv6", "a dual-stack socket")
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    try:
        client.connect(("::ffff:127.0.0.1", server.getsockname()[1]))
        accepted, _ = server.accept()
        assert client.getsockname()[0] == "::ffff:127.0.0.1" and accepted.getpeername()[0] == "127.0.0.1"
        assert owned_by(accepted, [os.getpid()])
        accepted.close()
    finally:
        client.close()
        server.close()
