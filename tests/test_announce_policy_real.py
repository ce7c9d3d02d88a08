"""The announce policy on a real tower over real RNS, with short timers
(test_announcer_policy.py checks the same rules on a test double):
heartbeats come every heartbeat_s, never two announces closer than floor_s
however often clients ping, a material change (a new adapter) is announced
at once, and an entry expires 2.5 heartbeats after the tower went quiet."""

import os
import time

import pytest
import RNS

from announce.table import EXPIRY_HEARTBEATS
from reticulum_grid.node.connection import wait_until
from tests.arrivals import Arrivals

HEARTBEAT_S, FLOOR_S = 3.0, 2.0
#: The announcer looks at its timers every CHECK_S seconds (Announcer.check_s),
#: so a heartbeat may come up to that much late.
CHECK_S = 2.0


@pytest.fixture(scope="module")
def arrivals():
    handler = Arrivals()
    RNS.Transport.register_announce_handler(handler)
    yield handler
    RNS.Transport.deregister_announce_handler(handler)


@pytest.fixture(scope="module")
def tower(hub, arrivals):
    t = hub.start_tower("policy-a", models={}, roles=("infer", "sync"),
                        announce={"heartbeat_s": HEARTBEAT_S, "floor_s": FLOOR_S})
    entry = hub.wait_tower(t.name)
    yield t, entry.destination_hash
    t.stop()


def heard(arrivals, dest, after=0.0):
    return [t for t in arrivals.times.get(dest, []) if t >= after]


def test_heartbeats_come_every_heartbeat_s(arrivals, tower):
    _, dest = tower
    start = time.monotonic()
    time.sleep(2 * (HEARTBEAT_S + CHECK_S) + 0.5)
    times = heard(arrivals, dest, start)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(times) >= 2 and all(HEARTBEAT_S - 0.2 <= g <= HEARTBEAT_S + CHECK_S + 0.3 for g in gaps), gaps


def test_pings_never_push_announces_below_the_floor(hub, arrivals, tower):
    t, dest = tower
    start = time.monotonic()
    # A discovery ping every 1.1 s, faster than the floor allows announces. (RNS
    # drops a second announce of one destination within the same second: its
    # emission time has 1 s resolution, so pings closer than that never arrive.)
    for _ in range(5):
        hub.grid._pinger.ping()
        time.sleep(1.1)
    time.sleep(FLOOR_S)
    times = heard(arrivals, dest, start)
    assert times and times[0] - start < FLOOR_S + 0.5, "a ping is answered within the floor"
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(times) >= 2 and all(g >= FLOOR_S - 0.15 for g in gaps), gaps  # loopback jitter << 0.15 s
    assert "announced (discovery ping)" in t.log()


def test_a_new_adapter_is_announced_at_once(hub, arrivals, tower, tmp_path):
    t, dest = tower
    adapter = tmp_path / "tiny-adapter.gguf"
    adapter.write_bytes(b"GGUF" + os.urandom(4000))  # the store checks the GGUF magic only
    hub.grid.store.add_file(adapter, alias="policy-lora", kind="adapter")
    time.sleep(FLOOR_S)  # past the floor, so only the change itself decides when
    hub.grid.push("policy-lora", hub.wait_tower(t.name))
    pushed = time.monotonic()
    assert wait_until(lambda: (e := hub.grid.table.get(dest)) and "policy-lora" in [a.alias for a in e.caps.adapters],
                      HEARTBEAT_S + CHECK_S), "the new adapter was not announced"
    # At once (at most a floor after the last announce), for the change itself:
    assert time.monotonic() - pushed < FLOOR_S + 0.5 and "announced (blob received)" in t.log()


def test_an_entry_expires_after_two_and_a_half_heartbeats(hub, arrivals, tower):
    t, dest = tower
    t.stop()
    last = heard(arrivals, dest)[-1]
    assert hub.grid.table.get(dest) is not None
    assert wait_until(lambda: hub.grid.table.get(dest) is None, EXPIRY_HEARTBEATS * HEARTBEAT_S + 3)
    gone = time.monotonic() - last
    assert EXPIRY_HEARTBEATS * HEARTBEAT_S - 0.5 <= gone <= EXPIRY_HEARTBEATS * HEARTBEAT_S + 1.5, gone
