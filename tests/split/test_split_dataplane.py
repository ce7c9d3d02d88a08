"""Split inference over the data plane (split/direct.py): the RPC bytes go
straight between two towers' data-plane addresses (127.0.0.1 here), admitted
by a per-plan HMAC challenge; the RNS tunnel stays the fallback.

Towers dp-a (holds the GGUF) and dp-b each lend 200 MiB, the model needs
~316 MiB, so a plan takes both; the client runs in its own process
(tests/client_process.py) as in test_split.py."""

import socket

import psutil
import pytest

from links.wire import Code, WireError
from reticulum_grid.node.dataplane import AUTH_TIMEOUT_S, NONCE_BYTES
from reticulum_grid.split import direct
from testbed.requirements import needs
from tests.split.split_support import ALIAS, client_of, identity_home, lender

pytestmark = needs("llama-rpc", "split inference rides on llama.cpp's RPC backend")

LEND = {"lend_mib": 200, "threads": 1}


@pytest.fixture(scope="module")
def dp_grid(hub, model_path, tmp_path_factory):
    home, client_id = identity_home(tmp_path_factory, "dp-client")
    names = ["sdp-a", "sdp-b", "sdp-c"]

    def tower(name, connect, holds_model=False):
        return lender(hub, name, names, {client_id: ["infer"]}, connect, shard=LEND, dataplane="127.0.0.1",
                      holds=[(model_path, ALIAS)] if holds_model else ())

    a = tower("sdp-a", [], holds_model=True).start()
    b = tower("sdp-b", [a.address]).start()
    c = tower("sdp-c", [a.address, b.address]).start()
    towers = {"sdp-a": a, "sdp-b": b, "sdp-c": c}
    with client_of(hub, home, towers) as client:
        yield towers, client


def closed(sock):
    """True once the other end closed ``sock`` (an orderly close, or a reset for unread bytes)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def fronts(tower):
    """(host, port) of the data-plane fronts ``tower``'s process listens on (not its RNS port)."""
    out = []
    for conn in psutil.Process(tower.proc.pid).net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port != tower.port:
            out.append((conn.laddr.ip, conn.laddr.port))
    return out


def test_the_split_runs_over_the_data_plane_with_identical_text(dp_grid, reference):
    towers, client = dp_grid
    client.send(max_tokens=48)
    text, usage, error, plan = client.result()
    assert error is None, error
    assert plan[-1] == "sdp-a" and len(plan) == 2
    assert text == reference(48)
    assert "RPC over the data plane" in towers["sdp-a"].log(), "the coordinator used the data plane"
    assert "through the RNS tunnel" not in towers["sdp-a"].log()
    worker = towers[plan[0]]
    assert fronts(worker), "the worker listens on its data-plane address for this plan"


def test_the_front_refuses_a_connection_without_the_answer(dp_grid):
    towers, client = dp_grid
    for name in ("sdp-b", "sdp-c"):
        for host, port in fronts(towers[name]):
            for answer in (b"", b"\0" * 32):
                # Silent, the front waits AUTH_TIMEOUT_S for an answer; the socket waits ten times that.
                with socket.create_connection((host, port), timeout=10 * AUTH_TIMEOUT_S) as s:
                    hello = s.recv(len(direct.GREETING) + NONCE_BYTES)
                    assert hello.startswith(direct.GREETING)
                    if answer:
                        s.sendall(answer + b"\x0e" * 64)  # a wrong answer, then an RPC HELLO's worth of bytes
                    assert closed(s), "the front closes a connection that does not answer right"
    assert "over the data plane" in towers["sdp-a"].log(), "the data-plane test above ran"


def test_a_peer_without_shard_gets_no_data_plane_front(dp_grid, hub):
    towers, _ = dp_grid
    before = fronts(towers["sdp-c"])
    with pytest.raises(WireError) as refused:
        hub.grid.connection(hub.wait_tower("sdp-c")).request("shard/tunnel", {"dataplane": "127.0.0.1"})
    assert refused.value.code == Code.NOT_ALLOWED and "shard" in refused.value.message
    assert fronts(towers["sdp-c"]) == before, "no front was opened for it"


def test_a_killed_worker_fails_over_with_identical_text_on_the_data_plane(dp_grid, reference):
    towers, client = dp_grid
    client.send(max_tokens=160)
    plan = client.next()["plan"]
    worker = towers[plan[0]]
    first = client.next()["text"]
    worker.kill()
    text, usage, error, new_plan = client.result()
    assert error is None, error
    assert usage["failovers"] >= 1 and plan[0] not in new_plan and "sdp-a" in new_plan
    assert first + text == reference(160)
    assert towers["sdp-a"].log().count("RPC over the data plane") >= 2, "the new plan went over the data plane too"
