"""An exposed gateway under a flood (gateway/intake.py), `rngrid serve` in its
own process, its memory read with psutil:

- 100 keyless uploads declaring 4 MiB that stall: each is answered 401 before
  any of its body is read, its connection closed, and the gateway's RSS stays
  within 50 MiB of idle while they are open and after they close;
- the same with the key and bodies of 4 MiB less a few KiB: the bodies held at
  once stay under the budget, and the memory comes back after;
- a body that trickles in is cut after --body-timeout seconds (408);
- more requests than --max-requests at once: the next is answered 503;
- a declared body over the limit is 413 without being read.
"""

import contextlib
import importlib
import socket

import httpx
import psutil
import pytest

from reticulum_grid.gateway import intake
from reticulum_grid.gateway.intake import BODY_BUDGET_BYTES, MAX_BODY_BYTES
from tests.gateway_support import laptop, serve_process

KEY = "fl00d-key"
MIB = 1 << 20
FLOOD = 100
MAX_REQUESTS = 8
BODY_TIMEOUT_S = 3
#: What a flood may add to the gateway's RSS (the issue's bound).
SLACK = 50 * MIB


@pytest.fixture(scope="module")
def gateway(hub, tmp_path_factory):
    """(port, psutil.Process) of `rngrid serve --api-key` with small limits."""
    args = ["--api-key", KEY, "--max-requests", str(MAX_REQUESTS), "--body-timeout", str(BODY_TIMEOUT_S)]
    with serve_process(laptop(hub, tmp_path_factory.mktemp("flood")), hub.address, args, process=True) as (port, proc):
        yield port, psutil.Process(proc.pid)


def head(port, key=None, length=MAX_BODY_BYTES, path="/v1/chat/completions"):
    """The request line and headers of a JSON POST declaring ``length`` bytes of body."""
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n{auth}"
            f"Content-Length: {length}\r\n\r\n").encode()


def opened(port, data):
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(data)
    return sock


def status(sock):
    """The status code of the response read from ``sock`` (None when it closed without one)."""
    reply = b""
    while b"\r\n" not in reply:
        piece = sock.recv(4096)
        if not piece:
            return None
        reply += piece
    return int(reply.split(b" ", 2)[1])


def push(sock, size):
    """Send up to ``size`` bytes of body, stopping where the gateway stops reading (closed or full)."""
    sock.settimeout(2)
    piece = b"x" * (64 << 10)
    with contextlib.suppress(OSError):
        for _ in range(size // len(piece)):
            sock.sendall(piece)
    sock.settimeout(60)


def idle_rss(port, proc):
    """The gateway's RSS (bytes) once it has answered a keyed and a keyless request (its code is loaded)."""
    for headers in ({"Authorization": f"Bearer {KEY}"}, {}):
        httpx.get(f"http://127.0.0.1:{port}/health", headers=headers, timeout=60)
    return proc.memory_info().rss


def test_stalled_keyless_uploads_are_refused_unread_and_hold_no_memory(gateway):
    port, proc = gateway
    idle = idle_rss(port, proc)
    socks = [opened(port, head(port) + b"{" * 4096) for _ in range(FLOOD)]
    try:
        # The 401 arrives while 4 MiB of the declared body were never sent: nothing waited for it.
        assert [status(s) for s in socks] == [401] * FLOOD
        for sock in socks:
            push(sock, MAX_BODY_BYTES - 8192)
        during = proc.memory_info().rss
    finally:
        for sock in socks:
            sock.close()
    after = proc.memory_info().rss
    assert during - idle < SLACK, f"idle {idle / MIB:.0f} MiB, during the flood {during / MIB:.0f} MiB"
    assert after - idle < SLACK, f"idle {idle / MIB:.0f} MiB, after the flood {after / MIB:.0f} MiB"


def test_stalled_keyed_uploads_hold_at_most_the_budget_and_give_it_back(gateway):
    port, proc = gateway
    idle = idle_rss(port, proc)
    socks = [opened(port, head(port, KEY)) for _ in range(MAX_REQUESTS)]
    try:
        for sock in socks:
            push(sock, MAX_BODY_BYTES - 8192)
        during = proc.memory_info().rss
        # Each stalls short of its body: the gateway cuts it at the body timeout (408) or the budget (503).
        codes = [status(s) for s in socks]
    finally:
        for sock in socks:
            sock.close()
    after = proc.memory_info().rss
    assert set(codes) <= {408, 503}, codes
    assert during - idle < BODY_BUDGET_BYTES + SLACK, f"idle {idle / MIB:.0f} MiB, during {during / MIB:.0f} MiB"
    assert after - idle < SLACK, f"idle {idle / MIB:.0f} MiB, after the keyed flood {after / MIB:.0f} MiB"


def test_a_slow_body_is_cut_after_the_body_timeout(gateway):
    port, _ = gateway
    with opened(port, head(port, KEY, length=1000) + b"[") as sock:
        sock.settimeout(0.5)
        sent = 1
        while sent < 1000:  # a byte every half second: the whole body would take over 8 minutes
            try:
                reply = sock.recv(4096)
                break
            except TimeoutError:
                sock.sendall(b" ")
                sent += 1
        sock.settimeout(10)
        while part := sock.recv(4096):  # the server closes after its answer, whose body may come in a later segment
            reply += part
        assert reply.startswith(b"HTTP/1.1 408 ") and b"did not arrive within 3 s" in reply
        assert sent < 1000


def test_requests_beyond_the_cap_get_503_and_the_cap_frees(gateway):
    port, _ = gateway
    socks = [opened(port, head(port, KEY, length=100)) for _ in range(MAX_REQUESTS)]
    try:
        reply = httpx.get(f"http://127.0.0.1:{port}/health", headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
        assert reply.status_code == 503 and "at once" in reply.json()["error"]["message"]
        assert reply.headers["retry-after"] == "1"
        assert [status(s) for s in socks] == [408] * MAX_REQUESTS
    finally:
        for sock in socks:
            sock.close()
    assert httpx.get(f"http://127.0.0.1:{port}/health", headers={"Authorization": f"Bearer {KEY}"},
                     timeout=60).status_code == 200


def test_a_declared_body_over_the_limit_is_413_unread(gateway):
    port, _ = gateway
    with opened(port, head(port, KEY, length=MAX_BODY_BYTES + 1)) as sock:
        assert status(sock) == 413
    with opened(port, head(port, length=MAX_BODY_BYTES + 1, path="/api/chat")) as sock:
        assert status(sock) == 401


def test_the_cli_defaults_are_the_intakes():
    cli = importlib.import_module("reticulum_grid.cli.serve")  # the package's `serve` is the click command

    assert (cli.MAX_REQUESTS, cli.BODY_TIMEOUT_S) == (intake.MAX_REQUESTS, intake.BODY_TIMEOUT_S)
