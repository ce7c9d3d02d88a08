"""A private grid on a shared medium (rnsnet.py, IFAC): a node without the
grid's network name and passphrase hears no announce from its towers and
cannot open a Link to one, on the same wire where a node with them does.

The network lab (testbed/lab/): a client host and a tower host in their own
network namespaces joined by a tailnet-shaped relay; every interface the lab
writes carries the IFAC lines rnsnet.ifac_lines makes. The outsider is a node
in the client's namespace on the same relay, without them."""

import json
import sys

import pytest

from reticulum_grid.node import rnsnet
from testbed.lab.topology import RELAY_PORT, Lab, interface, rns_config
from testbed.requirements import needs

pytestmark = needs("netns", "the network lab's hosts are network namespaces")

IFAC = {"network_name": "lab grid, #1", "passphrase": "correct horse 'battery' \"staple\""}


@pytest.fixture(scope="module")
def private(tmp_path_factory):
    lab = Lab(tmp_path_factory.mktemp("lab-ifac"), "tailnet", ifac=IFAC)
    try:
        lab.start_tower(models={})
        yield lab
    finally:
        lab.close()


def probes(lab, *rns_dirs):
    """What each probe (testbed/lab/ifac_probe.py) on ``rns_dirs`` got, all run at
    once: one that hears nothing waits out its whole 15 s twice."""
    procs = [lab.popen_client([sys.executable, "-m", "testbed.lab.ifac_probe", "--rns-config", str(rns_dir),
                               "--tower-identity", str(lab.tower.dir / "identity"), "--wait", "15"],
                              stdout=-1, stderr=-1, text=True) for rns_dir in rns_dirs]
    got = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        got.append(json.loads(out.strip().splitlines()[-1]))
    return got


def test_only_nodes_with_the_passphrase_hear_and_reach_the_tower(private):
    hop = private.hops[0]
    addr_b = private.wires[0][1]
    outsider = rns_config(private.root / "rns" / "outsider", [interface(
        "hop 0", "TCPClientInterface", hop.rns_bitrate, target_host=addr_b, target_port=RELAY_PORT)], transport=False)
    wrong = rns_config(private.root / "rns" / "wrong", [interface(
        "hop 0", "TCPClientInterface", hop.rns_bitrate, target_host=addr_b, target_port=RELAY_PORT)
        + rnsnet.ifac_lines(IFAC["network_name"], "a guess")], transport=False)
    member, stranger, guesser = probes(private, private.client_rns, outsider, wrong)
    print(f"with the passphrase: {member}; without IFAC: {stranger}; a wrong passphrase: {guesser}")
    assert member == {"heard": True, "link": True}
    assert stranger == {"heard": False, "link": False} and guesser == {"heard": False, "link": False}
    assert "passphrase" in (private.client_rns / "config").read_text()
