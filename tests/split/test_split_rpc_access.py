"""Who may reach a worker's RPC server, and what frees it (split/rpcworker.py,
split/lease.py, split/tunnel.py's keepalive, node/private_net.py).

Real ggml-rpc-server processes throughout; the tower tests run a real worker
tower, the test process as one coordinator and tests/split/rpc_holder.py (its own
process, RNS instance and identity) as another that takes the server and holds
it until it is killed."""

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from links.wire import Code, WireError
from reticulum_grid.node import childguard, private_net
from reticulum_grid.node.localgrid import TowerProcess, TransportProcess, trust_local_towers
from reticulum_grid.split.lease import Holder, RpcLease
from reticulum_grid.split.rpcworker import RpcWorker, hello, round_trip
from reticulum_grid.split.tunnel import TunnelListener, Tunnels
from tests.split.split_support import identity_home
from testbed.requirements import need, needs

pytestmark = needs("llama-rpc", "the RPC server is llama.cpp's ggml-rpc-server")

HERE = Path(__file__).resolve().parent
#: The issue's bound: a worker whose server a dead peer held is usable again within this (seconds).
USABLE_AGAIN_S = 30.0


def private_network_or_skip():
    need("private-net", "the RPC server in a network namespace of its own")


def server_of(worker):
    """(pid, TCP port) of the ggml-rpc-server a worker runs."""
    pid = childguard.program_pid(worker.guard)
    argv = psutil.Process(pid).cmdline()
    return pid, int(argv[argv.index("-p") + 1])


def refused_from_here(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.fixture
def worker(tmp_path):
    made = []

    def make(**kw):
        made.append(RpcWorker(tmp_path / f"rpc{len(made)}.log", threads=1, **kw))
        return made[-1]

    yield make
    for w in made:
        w.stop()


def test_no_other_process_reaches_the_server(worker):
    private_network_or_skip()
    w = worker()
    w.ready()
    pid, port = server_of(w)
    assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    assert refused_from_here(port), "a process outside the tower reached its RPC server"
    with w.connect() as conn:  # the tower's own way in still works
        assert hello(conn)


def test_another_user_is_refused_before_any_rpc_command(worker):
    private_network_or_skip()
    need("another-user", "a process of another user")
    setpriv, python = shutil.which("setpriv"), shutil.which("python3", path="/usr/bin:/bin")
    w = worker()
    w.ready()
    _, port = server_of(w)
    probe = ("import socket, sys\ntry:\n    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5)\n"
             "    print('connected')\nexcept ConnectionRefusedError:\n    print('refused')\n")
    done = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", probe, str(port)],
                          capture_output=True, text=True, timeout=30, cwd="/")
    assert done.stdout.strip() == "refused", (done.stdout, done.stderr)
    log = Path(w.log_path).read_text(errors="replace")
    assert "Expected HELLO" not in log and "Unknown command" not in log  # no byte of it reached the server


@pytest.mark.parametrize("private", [True, False], ids=["private-network", "host-loopback"])
def test_a_held_server_is_started_again_and_answers(worker, private):
    """A connection that holds the server (a local holder where the server is on
    the host's loopback; a stale tunnel of the tower's own otherwise) does not
    keep it: ready() finds no HELLO answer, starts it again, and it answers."""
    if private:
        private_network_or_skip()
    w = worker(private=private)
    w.ready()
    first_pid, port = server_of(w)
    if private:
        holder = w.connect()
    else:
        holder = socket.create_connection(("127.0.0.1", port), timeout=5)
    assert hello(holder)  # it is being served now, and stays silent
    assert not w.answers_hello(2.0)
    w.ready(timeout_s=5.0)
    assert w.restarts == 1 and server_of(w)[0] != first_pid
    assert w.answers_hello(5.0)
    holder.settimeout(10)
    assert holder.recv(1) == b""  # the holder's server is gone


@pytest.mark.parametrize("private", [True, False], ids=["private-network", "host-loopback"])
def test_the_towers_connection_has_no_timeout(worker, private):
    """A tunnel's connection rests between a loaded split model's requests:
    one with a timeout would end the plan after its first quiet spell."""
    if private:
        private_network_or_skip()
    w = worker(private=private)
    w.ready()
    with w.connect(timeout_s=2.0) as conn:
        assert conn.gettimeout() is None and hello(conn)


def test_an_rpc_round_trip_is_timed_on_the_connection_that_said_hello(worker):
    """rpcworker.round_trip: llama.cpp's DEVICE_COUNT, answered by the real server as often as asked after
    the HELLO (the coordinator times several on the connection that proves a worker's link); a reply of the
    wrong size is no round trip."""
    w = worker(private=False)
    w.ready()
    with w.connect() as conn:
        assert hello(conn)
        times = [round_trip(conn) for _ in range(5)]
        assert all(t is not None and t > 0 for t in times), times
    ours, fake = socket.socketpair()
    with ours, fake:
        fake.sendall(struct.pack("<Q", 8) + bytes(8))  # an 8-byte answer where DEVICE_COUNT has 4
        assert round_trip(ours) is None
        assert fake.recv(9) == bytes([15]) + bytes(8)  # what it sent: the command, no input


# -- one plan at a time (split/lease.py), without a tower ----------------------------------------

def holder(token, who):
    ended = []
    return Holder(token, who, who.hex()[:16], end=lambda: ended.append(token), last_active=lambda: None), ended


def test_a_second_coordinator_gets_busy_naming_the_holder():
    lease = RpcLease(idle_s=3600)
    first, first_ended = holder(object(), b"\x01" * 16)
    assert lease.take(first) is True
    assert lease.take(first) is False  # the same plan asking again: already its own
    with pytest.raises(WireError) as busy:
        lease.take(holder(object(), b"\x02" * 16)[0])
    assert busy.value.code == Code.BUSY and "01" * 8 in busy.value.message and busy.value.retry_after
    assert not first_ended and lease.holder is first


def test_the_holders_new_plan_and_an_idle_plan_take_over_and_end_the_old_one():
    lease = RpcLease(idle_s=3600)
    old, old_ended = holder(object(), b"\x01" * 16)
    lease.take(old)
    new, _ = holder(object(), b"\x01" * 16)  # the same coordinator planned again on a new Link
    assert lease.take(new) and old_ended and lease.holder is new
    idle_lease = RpcLease(idle_s=0.0)
    idle, idle_ended = holder(object(), b"\x01" * 16)
    idle_lease.take(idle)
    other, _ = holder(object(), b"\x02" * 16)
    assert idle_lease.take(other) and idle_ended and idle_lease.holder is other
    idle_lease.release(idle.token)  # the old Link's close, late: the new holder stays
    assert idle_lease.holder is other
    idle_lease.release(other.token)
    assert idle_lease.holder is None


# -- a worker tower ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lending(hub, tmp_path_factory):
    """A worker tower lending memory, granting ``shard`` to the hub and to the holder's identity."""
    holder_home = identity_home(tmp_path_factory, "rpc-holder")
    transport = TransportProcess(hub.root, "rpc-transport").start()
    tower = TowerProcess(hub.root, "rpc-lender", {}, connect=[hub.address, transport.address],
                         shard={"lend_mib": 200, "threads": 1},
                         allow={hub.grid.identity_hash: ["shard"], holder_home.identity: ["shard"]})
    hub.towers.append(tower)
    tower.start()
    trust_local_towers(holder_home.path)
    yield tower, holder_home, transport
    tower.stop()
    transport.stop()


def tunnel_hello(hub, entry):
    """Take the worker's server as the hub's coordinator: shard/tunnel, one
    tunnel, HELLO through it. Returns (connection, listener, socket, answered)."""
    conn = hub.grid.connection(entry)
    conn.request("shard/tunnel", {}, timeout=30)
    listener = TunnelListener(Tunnels(conn.router), lambda: [os.getpid()])
    host, port = listener.endpoint.split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    return conn, listener, sock, hello(sock)


@pytest.mark.parametrize("via", ["tower", "transport"], ids=["its-own-interface", "through-a-transport-node"])
def test_a_dead_holder_frees_the_worker_and_busy_says_who_holds_it(lending, hub, via):
    """The holder's tower dies with its Link up. Connected to the worker itself,
    the worker's interface to it goes away; through a transport node that
    stays, and only the unacknowledged keepalive tells."""
    tower, holder_home, transport = lending
    entry = hub.wait_tower("rpc-lender")
    address = tower.address if via == "tower" else transport.address
    holder = subprocess.Popen([sys.executable, str(HERE / "rpc_holder.py"), str(holder_home.path), address,
                               "rpc-lender"], stdout=subprocess.PIPE, text=True, cwd=HERE.parents[1])
    try:
        line = holder.stdout.readline()
        assert json.loads(line) == {"held": True}, line
        # The truth meanwhile: busy, naming the holder's identity.
        with pytest.raises(WireError) as busy:
            hub.grid.connection(entry).request("shard/tunnel", {}, timeout=30)
        assert busy.value.code == Code.BUSY and holder_home.identity[:16] in busy.value.message, busy.value
        # A local process still cannot reach the server the holder has.
        server = [p for p in psutil.Process(tower.proc.pid).children(recursive=True)
                  if p.name().startswith("ggml-rpc")]
        assert len(server) == 1
        argv = server[0].cmdline()
        if not private_net.unavailable():
            assert refused_from_here(int(argv[argv.index("-p") + 1]))
    finally:
        holder.kill()  # its tower dies with its Link up: nothing tells the worker
        holder.wait(10)
    deadline = time.monotonic() + USABLE_AGAIN_S
    answered, error = False, None
    while time.monotonic() < deadline and not answered:
        try:
            conn, listener, sock, answered = tunnel_hello(hub, entry)
            sock.close()
            listener.close()
            conn.close()  # the hub's plan ends: the next test's holder finds the server free
        except WireError as e:
            error = e
            assert e.code == Code.BUSY, e  # the truth: still held until the keepalive finds the holder gone
            time.sleep(1.0)
    assert answered, f"the worker was still held {USABLE_AGAIN_S:.0f} s after its holder died: {error}"
    assert "RPC server passes" not in tower.log()  # freed by the dead holder's Link closing, not taken from a live one
