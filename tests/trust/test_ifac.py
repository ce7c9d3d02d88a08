"""A private grid's interface access code (IFAC) in every RNS config rngrid
writes: tower, client, transport node, gateway (rnsnet.py). Real processes on
loopback; tests/lab/test_lab_ifac.py shows the same across network namespaces."""

import json
import subprocess
import sys

from RNS.vendor.configobj import ConfigObj

from reticulum_grid.node import rnsnet
from reticulum_grid.node.localgrid import TowerProcess, free_port, wait_port
from tests.conftest import rngrid

NAME, PASSPHRASE = "our grid, #2", "it's a \"secret\""


def interfaces(config_dir):
    return ConfigObj(str(config_dir / "config"))["interfaces"]


def test_the_config_text_round_trips_through_rns_own_parser(tmp_path):
    rnsnet.write_config(tmp_path, listen="127.0.0.1:4242", connect=["127.0.0.1:4243"], network_name=NAME,
                        passphrase=PASSPHRASE)
    found = interfaces(tmp_path)
    assert len(found) == 2 and all(i["network_name"] == NAME and i["passphrase"] == PASSPHRASE
                                   for i in found.values())
    assert (tmp_path / "config").stat().st_mode & 0o077 == 0, "the passphrase is readable by others"


def test_a_private_tower_is_heard_only_with_its_passphrase(tmp_path):
    tower = TowerProcess(tmp_path, "ifac-tower", {}, connect=[], network_name=NAME, passphrase=PASSPHRASE).start()
    try:
        assert interfaces(tower.dir / "rns")["rngrid tcp server"]["passphrase"] == PASSPHRASE
        ifac = ["--network-name", NAME, "--passphrase", PASSPHRASE]
        member = rngrid("towers", "--json", "--wait", "10", "--connect", tower.address, *ifac, home=tmp_path / "a")
        assert member.returncode == 0, member.stderr[-2000:]
        assert [r["name"] for r in json.loads(member.stdout)] == ["ifac-tower"]
        assert interfaces(tmp_path / "a" / "rns")["rngrid tcp peer 0"]["network_name"] == NAME
        outsider = rngrid("towers", "--json", "--wait", "10", "--connect", tower.address, home=tmp_path / "b")
        assert json.loads(outsider.stdout or "[]") == [], outsider.stdout
    finally:
        tower.stop()


def test_a_transport_node_listens_on_loopback_by_default_and_takes_the_passphrase(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "reticulum_grid", "--home", str(tmp_path), "transport",
                             "--config-dir", str(tmp_path / "t"), "--listen", f"127.0.0.1:{port}",
                             "--network-name", NAME, "--passphrase", PASSPHRASE],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_port(port, 60)
        server = interfaces(tmp_path / "t")["rngrid tcp server"]
        assert (server["network_name"], server["passphrase"]) == (NAME, PASSPHRASE)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    shown = rngrid("transport", "--help", home=tmp_path)
    assert "127.0.0.1:4242" in shown.stdout and "0.0.0.0:4242]" not in shown.stdout
