"""The configs we ship and write: parseable by RNS, ingress control off, no AutoInterface in tests."""

from pathlib import Path

import pytest
from RNS.vendor.configobj import ConfigObj

from reticulum_grid.node.rnsnet import config_text

SHIPPED = sorted((Path(__file__).resolve().parents[2] / "rnsconfig").glob("*/config"))


def interfaces(text):
    return ConfigObj(text.splitlines())["interfaces"]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.parent.name)
def test_shipped_configs(path):
    ifaces = interfaces(path.read_text())
    assert ifaces and all(i["ingress_control"] == "No" for i in ifaces.values())


def test_generated_config():
    text = config_text(listen="127.0.0.1:4000", connect=["127.0.0.1:4001"], link_bitrate=9600)
    ifaces = interfaces(text)
    assert {i["type"] for i in ifaces.values()} == {"TCPServerInterface", "TCPClientInterface"}
    assert all(i["ingress_control"] == "No" and i["bitrate"] == "9600" for i in ifaces.values())
    assert "AutoInterface" not in text and "share_instance = No" in text


def test_a_taken_listen_port_is_a_clear_error():
    import socket

    from reticulum_grid.node import rnsnet
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with pytest.raises(OSError, match="already running"):
            rnsnet.check_listen(f"127.0.0.1:{port}")
    rnsnet.check_listen(f"127.0.0.1:{port}")  # free again
