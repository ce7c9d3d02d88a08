"""The lab's shaping bridge (testbed/lab/bridge.py) with three hosts on one link:
each host reaches the others at their own addresses, and a frame for one host
goes out that host's side only once the bridge has seen it (a three-tower
split in the lab sends the coordinator's RPC bytes to each worker, never to
the other). Skipped, with the reason, where namespaces cannot be made."""

import json
import signal
import subprocess
import sys

import pytest

from testbed.lab.netns import Namespaces
from testbed.requirements import needs

pytestmark = needs("netns", "the network lab's hosts are network namespaces")

PORT = 7311
PAYLOAD = 200_000
#: A host's server: counts the bytes of one connection and answers with the count.
SERVER = """import socket, sys
s = socket.create_server((sys.argv[1], %d)); print("ready", flush=True)
c, _ = s.accept(); n = 0
while (d := c.recv(65536)): n += len(d)
c.sendall(str(n).encode()); c.close()
""" % PORT
CLIENT = """import socket, sys
c = socket.create_connection((sys.argv[1], %d), timeout=20); c.sendall(bytes(%d)); c.shutdown(socket.SHUT_WR)
print(c.recv(64).decode())
""" % (PORT, PAYLOAD)


@pytest.fixture
def three_hosts(tmp_path):
    ns = Namespaces()
    started = []
    try:
        hosts = [ns.add(role) for role in ("a", "b", "c")]
        link = ns.add("link")
        addresses, ends = ns.bridged(hosts, link)
        stats = tmp_path / "link.json"
        bridge = subprocess.Popen(ns.argv(link, [sys.executable, "-m", "testbed.lab.bridge", "--a", ends[0], "--b",
                                                 ends[1], "--c", ends[2], "--rate", "100000000", "--delay", "0.001",
                                                 "--stats", str(stats)]), stdout=subprocess.PIPE, text=True)
        started.append(bridge)
        assert bridge.stdout.readline().strip() == "ready"
        yield ns, hosts, addresses, bridge, stats, started
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        ns.close()


def test_each_host_reaches_the_others_and_unicast_goes_to_its_host_only(three_hosts):
    ns, hosts, addresses, bridge, stats, started = three_hosts
    for target in (2, 1):  # a sends to c, then to b
        server = subprocess.Popen(ns.argv(hosts[target], [sys.executable, "-c", SERVER, addresses[target]]),
                                  stdout=subprocess.PIPE, text=True)
        started.append(server)
        assert server.stdout.readline().strip() == "ready"
        sent = subprocess.run(ns.argv(hosts[0], [sys.executable, "-c", CLIENT, addresses[target]]),
                              capture_output=True, text=True, timeout=60)
        assert sent.returncode == 0, sent.stderr
        assert int(sent.stdout) == PAYLOAD, "every byte reached the host at its own address"
        server.wait(10)
    bridge.send_signal(signal.SIGTERM)
    bridge.wait(10)
    counts = json.loads(stats.read_text())
    # a's bytes for c went to c's side, and for b to b's; each side saw the other's only as broadcasts (ARP).
    # (Flooded, each of a's sides would have carried both payloads.)
    assert PAYLOAD <= counts["bytes_ab"] < 1.5 * PAYLOAD and PAYLOAD <= counts["bytes_ac"] < 1.5 * PAYLOAD, counts
    assert counts.get("bytes_bc", 0) + counts.get("bytes_cb", 0) < PAYLOAD // 10, counts
