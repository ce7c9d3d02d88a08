"""Announce size limit and discovery through an RNS transport node (real RNS)."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
import RNS

from announce.announcer import app_data_limit
from announce.caps import CAPS_BUDGET
from reticulum_grid.inference.default_model import DEFAULT_ALIAS
from reticulum_grid.node.localgrid import TransportProcess

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def transport(hub):
    node = TransportProcess(hub.root, "transport-1", connect=[hub.address]).start()
    yield node
    node.stop()


class SizeListener:
    aspect_filter = "rngridtest.limit"

    def __init__(self):
        self.heard = {}
        self.count = {}

    def received_announce(self, destination_hash, announced_identity, app_data):
        self.heard[destination_hash] = len(app_data or b"")
        self.count[destination_hash] = self.count.get(destination_hash, 0) + 1


def test_app_data_limit_through_a_transport_node(hub, transport, tmp_path):
    limit = app_data_limit()
    assert limit == 317
    listener = SizeListener()
    RNS.Transport.register_announce_handler(listener)
    proc = subprocess.Popen([sys.executable, str(HERE / "announce_sizes.py"), str(tmp_path), transport.address,
                             str(limit), str(limit + 1)], stdout=subprocess.PIPE, text=True)
    try:
        sizes = dict(line.split() for line in (proc.stdout.readline(), proc.stdout.readline()))
        fits, too_big = bytes.fromhex(sizes[str(limit)]), bytes.fromhex(sizes[str(limit + 1)])
        deadline = time.monotonic() + 30
        while fits not in listener.heard and time.monotonic() < deadline:
            time.sleep(0.1)
        # The transport node tried to re-send the bigger one, announced alongside (and failed).
        deadline = time.monotonic() + 30
        while "exceeds MTU" not in transport.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "exceeds MTU" in transport.log(), "the transport node never tried to re-send the big announce"
        print(f"through a transport node: {limit} bytes heard={fits in listener.heard}, "
              f"{limit + 1} bytes heard={too_big in listener.heard}; our caps budget is {CAPS_BUDGET}")
        assert listener.heard.get(fits) == limit, f"the {limit}-byte announce never came through the transport node"
        assert RNS.Transport.hops_to(fits) == 2
        assert too_big not in listener.heard
        # The node that could not re-send the big one must keep forwarding (rnsfix): two
        # more of the announces that come every second (one might have been on its way).
        before = listener.count[fits]
        deadline = time.monotonic() + 15  # 15 of them; unpatched, the whole wait is the symptom
        while listener.count[fits] < before + 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert listener.count[fits] >= before + 2, "the transport node stopped forwarding after an oversized announce"
        assert CAPS_BUDGET <= limit - 48, "keep a margin under the measured limit"
    finally:
        RNS.Transport.deregister_announce_handler(listener)
        proc.kill()
        proc.wait()


def test_tower_behind_transport_node_is_discovered(hub, transport):
    tower = hub.start_tower("behind-transport", connect=[transport.address])
    try:  # it goes with its transport node, whatever fails here
        entry = hub.wait_tower(tower.name)
        assert entry.hops == 2 and entry.caps.model(DEFAULT_ALIAS).loaded
        pieces = list(hub.grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "prompt": "Hi", "max_tokens": 4},
                                       tower=tower.name))
        assert pieces[-1].completion_tokens > 0
    finally:
        tower.stop()
