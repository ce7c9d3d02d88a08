"""What the worker end sends back at once reaches the coordinator end of a
tunnel (split/tunnel.py), however late the thread that accepted the
connection runs again: the first reply (llama.cpp's HELLO is answered before
anything else crosses) and a refusal of the tunnel.

The coordinator end's pipe once started its reader before it was added to the
tunnels it belongs to; the reader sent the bytes the socket held at once, and
a reply handled on RNS's thread before the accepting thread had added the
pipe was dropped. A loaded machine lost the race in about 3 % of fresh
tunnels, and a split load then waited out its 60 s bound. Here the accepting
thread pauses after each thread it starts, as a loaded machine makes it
wait for a core, so the race is lost every time unless the pipe is added first.

Real RNS: the echo server (tests/wire/echo_server.py) in its own process is the
worker end, its tunnels lead to a TCP echo server; the coordinator end and the
connections are in this process."""

import os
import socket
import threading
import time

import pytest

from links.channel import ChannelRouter
from reticulum_grid.node.connection import open_link
from reticulum_grid.split.tunnel import MAX_TUNNELS, TunnelListener, Tunnels
from tests.wire import echo_server

#: How long the accepting thread pauses after starting each thread (seconds): far
#: longer than a loopback round trip through the echo server.
PAUSE_S = 0.5
#: A reply that is not lost comes within milliseconds; a lost one never comes.
REPLY_S = 10.0


@pytest.fixture(scope="module")
def echo_destination(hub, tmp_path_factory):
    proc, destination = echo_server.spawn(tmp_path_factory.mktemp("tunnel-echo"), hub.address)
    yield destination
    proc.kill()
    proc.wait(5)


@pytest.fixture
def tunnel(echo_destination, monkeypatch):
    """(a tunnel listener in this process over a new Link to the echo server, an
    Event): while the Event is set, the listener's accepting thread pauses after
    each thread it starts."""
    link = open_link(echo_destination, "rngridtest", "echo", timeout=30)
    listener = TunnelListener(Tunnels(ChannelRouter(link)), owners=lambda: [os.getpid()])
    pausing = threading.Event()
    start = threading.Thread.start

    def start_then_pause(thread):
        start(thread)
        if pausing.is_set() and threading.current_thread().name == "rngrid-tunnel-accept":
            time.sleep(PAUSE_S)

    monkeypatch.setattr(threading.Thread, "start", start_then_pause)
    yield listener, pausing
    listener.close()
    link.teardown()


def dial(listener):
    host, port = listener.endpoint.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=REPLY_S)


def test_the_first_reply_of_a_new_tunnel_is_not_lost(tunnel):
    listener, pausing = tunnel
    pausing.set()
    for i in range(4):
        with dial(listener) as sock:
            hello = f"HELLO {i}".encode()
            sock.sendall(hello)  # in the socket before the tunnel's reader starts, as llama.cpp's HELLO is
            try:
                assert sock.recv(64) == hello
            except TimeoutError:
                pytest.fail(f"tunnel {i + 1}: the echo of its first bytes never came")
    assert listener.tunnels.dropped_bytes == 0


def test_a_refused_tunnel_is_closed_here(tunnel):
    listener, pausing = tunnel
    held = []
    try:
        for _ in range(MAX_TUNNELS):  # the echo server's end carries no more than these at once
            held.append(dial(listener))
            held[-1].sendall(b"held")
            assert held[-1].recv(64) == b"held"
        pausing.set()
        with dial(listener) as refused:
            try:
                assert refused.recv(64) == b"", "a refused tunnel carried bytes"
            except TimeoutError:
                pytest.fail("the worker end refused the tunnel, and its socket here was left open")
    finally:
        for sock in held:
            sock.close()
