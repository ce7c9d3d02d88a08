"""Token streams on a real slow link (test_stream_codec.py checks the same
with test doubles): the tower reaches the client only through the lab's
shaping relay at radio-like speed. Tokens coalesce while the Channel window
is full, and the text equals llama.cpp's own completion.

Message shrinking on a small-MDU Link is tested in the network lab
(test_lab_links.py, a long error over lora-fast): there both ends' RNS know
the hop is a radio and use its 500-byte MTU, which a relay on loopback TCP
cannot make them do."""

import subprocess
import sys

import pytest

from reticulum_grid.client import Usage
from reticulum_grid.inference.default_model import DEFAULT_ALIAS, default_model_path
from reticulum_grid.node.localgrid import TowerProcess, free_port, wait_port
from testbed.leftovers import end

RATE_BPS = 4_000
PROMPT = "Count from 1 to 500, separated by commas: 1, 2, 3,"
TOKENS = 48


@pytest.fixture(scope="module")
def slow_tower(hub):
    port = free_port()
    host, hub_port = hub.address.split(":")
    relay = subprocess.Popen([sys.executable, "-m", "testbed.lab.shaper", "--mode", "tcp", "--listen",
                              f"127.0.0.1:{port}", "--target", f"{host}:{hub_port}", "--rate", str(RATE_BPS),
                              "--mtu", "500"])
    tower = None
    try:
        assert wait_port(port, 15), "the shaping relay did not listen"
        tower = TowerProcess(hub.root, "slow-a", {DEFAULT_ALIAS: default_model_path()},
                             allow={hub.grid.identity_hash: ["infer"]}, connect=[f"127.0.0.1:{port}"], listen=False)
        hub.towers.append(tower)
        tower.start()
        hub.wait_tower(tower.name, timeout=90)
        yield tower
    finally:
        if tower:
            tower.stop()
        end(relay)


def test_a_stream_over_a_slow_small_link_coalesces_and_loses_nothing(hub, slow_tower, reference):
    expected = reference.completion(PROMPT, TOKENS)
    # The Link first (its set-up is slow here; a request's own attempt bound is a few RTTs).
    hub.grid.connection(hub.wait_tower(slow_tower.name)).ensure_link(timeout=30)
    pieces = list(hub.grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "prompt": PROMPT, "max_tokens": TOKENS,
                                                    "temperature": 0.0}, tower=slow_tower.name))
    usage, texts = pieces[-1], pieces[:-1]
    assert isinstance(usage, Usage) and usage.completion_tokens == TOKENS
    assert "".join(texts) == expected, "coalescing must not lose, repeat or reorder a byte"
    # 500 B/s and a token message per ~100 bytes on the wire: without coalescing the window
    # would hold every token back; with it several tokens share a message.
    assert len(texts) <= TOKENS / 3, f"{len(texts)} messages for {TOKENS} tokens: tokens did not coalesce"
    print(f"{TOKENS} tokens arrived in {len(texts)} pieces")
