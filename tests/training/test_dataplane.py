"""The training data plane (training/rendezvous.py): rank 0's store front admits
only the job's peers' addresses, a rank's forwarder answers the challenge only
for its own worker process, and a tower's data plane is a private address.

Real processes: the front and the forwarder each run in a child process
(as inside a worker), and what reaches them comes from this process or
another child, over real sockets on loopback addresses (127.0.0.1, and
127.0.0.2 as a machine that is not in the job)."""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reticulum_grid.node import config
from reticulum_grid.training import rendezvous

ROOT = Path(__file__).resolve().parents[2]
SECRET = bytes(range(32))

#: A store (an echo server) behind a front that admits ``peers``; prints the front's port, then its counts.
FRONT = """
import json, socket, sys, threading, time
from reticulum_grid.training import rendezvous
store = socket.create_server(("127.0.0.1", 0))
def echo():
    while True:
        c, _ = store.accept()
        threading.Thread(target=lambda c=c: [c.sendall(d) for d in iter(lambda: c.recv(64), b"")], daemon=True).start()
threading.Thread(target=echo, daemon=True).start()
front = rendezvous.Front("127.0.0.1", 0, bytes(range(32)), store.getsockname()[1], peers=json.loads(sys.argv[1]))
print(front.port, flush=True)
sys.stdin.readline()
print(json.dumps({"admitted": front.admitted, "refused": front.refused}), flush=True)
"""

#: A forwarder to a front at argv[1]; it connects to itself twice (as its worker's store client would:
#: torch's uses an IPv6 socket, so the forwarder sees ::ffff:127.0.0.1), prints its port and what those
#: connections got back, then waits for the test; prints its refusals.
FORWARDER = """
import json, socket, sys
from reticulum_grid.training import rendezvous
fwd = rendezvous.Forwarder("127.0.0.1", int(sys.argv[1]), bytes(range(32)), timeout_s=10)
own = socket.create_connection(("127.0.0.1", fwd.port), timeout=10)
own.sendall(b"own")
mapped = socket.socket(socket.AF_INET6)
mapped.settimeout(10)
mapped.connect(("::ffff:127.0.0.1", fwd.port))
mapped.sendall(b"six")
print(fwd.port, own.recv(64).decode() + mapped.recv(64).decode(), flush=True)
sys.stdin.readline()
print(json.dumps({"refused": fwd.refused}), flush=True)
"""


def child(script, *args):
    return subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)


def finish(proc):
    proc.stdin.write("\n")
    proc.stdin.flush()
    out = json.loads(proc.stdout.readline())
    proc.wait(10)
    return out


def answered(port, source="127.0.0.1"):
    """Connect from ``source``, answer the challenge with the job's secret; what the echo store sends back."""
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as s:
        hello = s.recv(len(rendezvous.GREETING) + rendezvous.NONCE_BYTES)
        if not hello:
            return None
        s.sendall(rendezvous.answer(SECRET, hello[len(rendezvous.GREETING):]) + b"ping")
        try:
            return s.recv(64) or None
        except (ConnectionResetError, socket.timeout):
            return None


def test_the_front_admits_only_the_jobs_peers():
    front = child(FRONT, json.dumps(["127.0.0.1"]))
    try:
        port = int(front.stdout.readline())
        assert answered(port, "127.0.0.2") is None  # right secret, wrong machine
        assert answered(port, "127.0.0.1") == b"ping"
        assert finish(front) == {"admitted": 1, "refused": 1}
    finally:
        front.kill()


def test_the_forwarder_answers_for_its_own_process_only():
    front = child(FRONT, json.dumps(["127.0.0.1"]))
    forwarder = None
    try:
        forwarder = child(FORWARDER, front.stdout.readline().strip())
        port, own = forwarder.stdout.readline().split()
        assert own == "ownsix"  # its own store clients went through to the store and back
        with socket.create_connection(("127.0.0.1", int(port)), timeout=10) as s:  # another process
            s.sendall(b"set key value")
            try:
                got = s.recv(64)
            except (ConnectionResetError, socket.timeout):
                got = b""
        assert got == b"", "another local process was carried to the store"
        assert finish(forwarder) == {"refused": 1}
        assert finish(front)["admitted"] == 2
    finally:
        for proc in (front, forwarder):
            if proc is not None:
                proc.kill()


@pytest.mark.parametrize("address", ["8.8.8.8", "2001:4860::1", "0.0.0.0"])
def test_a_tower_data_plane_is_never_public_nor_every_interface(tmp_path, address):
    path = tmp_path / "tower.toml"
    config.write_tower(path, "dp", {}, dataplane=address)
    with pytest.raises(config.ConfigError, match="dataplane"):
        config.load_tower(path)


def test_a_private_data_plane_is_accepted(tmp_path):
    path = tmp_path / "tower.toml"
    for address in ("100.64.0.2", "192.168.1.20", "fd7a:115c:a1e0::1"):
        config.write_tower(path, "dp", {}, dataplane=address)
        assert config.load_tower(path).dataplane == address


def test_the_old_train_dataplane_key_is_refused_naming_the_new_one(tmp_path):
    path = tmp_path / "tower.toml"
    config.write_tower(path, "dp", {}, train={"dataplane": "100.64.0.2"})
    with pytest.raises(config.ConfigError, match=r"\[network\] dataplane"):
        config.load_tower(path)


def test_closing_a_front_ends_the_connections_it_relays():
    """A split plan's front closes with the plan's Link: the service behind it
    (an RPC server serving one connection at a time) must be freed too."""
    service = socket.create_server(("127.0.0.1", 0))
    front = rendezvous.Front("127.0.0.1", 0, SECRET, service.getsockname()[1], peers=["127.0.0.1"])
    try:
        with socket.create_connection(("127.0.0.1", front.port), timeout=10) as peer:
            hello = peer.recv(len(rendezvous.GREETING) + rendezvous.NONCE_BYTES)
            peer.sendall(rendezvous.answer(SECRET, hello[len(rendezvous.GREETING):]))
            held, _ = service.accept()  # the relayed connection reached the service
            held.settimeout(10)
            for _ in range(100):  # the front counts it just after it connected to the service
                if front.admitted:
                    break
                time.sleep(0.1)
            relayed_from_peer = [s for s in front.relayed if s.getsockname()[1] == front.port]
            assert relayed_from_peer and all(
                s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) for s in relayed_from_peer)
            front.close()
            assert held.recv(1) == b""  # the service sees its connection end
            peer.settimeout(10)
            assert peer.recv(1) == b""
            held.close()
    finally:
        front.close()
        service.close()
