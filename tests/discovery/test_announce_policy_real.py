"""The announce policy on a real tower over real RNS, with short timers
(test_announcer_policy.py checks the same rules on a test double):
heartbeats come every heartbeat_s, never two announces closer than floor_s
however often clients ping, a material change (a new adapter) is announced
at once, and an entry expires 2.5 heartbeats after the tower went quiet.

When the tower announced comes from its own log (1 ms resolution), so RNS's
delivery to this process adds nothing to the gaps; that they arrived comes
from an announce handler here. Every wait is for the event itself, with
deadlines generous enough for a loaded machine."""

import os
import time

import pytest
import RNS

from announce.table import EXPIRY_HEARTBEATS
from reticulum_grid.node.connection import wait_until
from testbed.arrivals import Arrivals, announced

HEARTBEAT_S, FLOOR_S = 3.0, 2.0
#: The announcer looks at its timers every CHECK_S seconds (Announcer.check_s),
#: so a heartbeat may come up to that much late.
CHECK_S = 2.0
#: What a loaded machine may add to a timer's wake-up (seconds).
SLACK_S = 1.0
#: The log's clock resolution (seconds).
TICK_S = 0.002


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


def since(tower, wall):
    """The tower's announces (wall time, reason) at or after ``wall``."""
    return [(at, reason) for at, reason in announced(tower.log()) if at >= wall]


def test_heartbeats_come_every_heartbeat_s(arrivals, tower):
    t, dest = tower
    start, wall = time.monotonic(), time.time()
    assert wait_until(lambda: [r for _, r in since(t, wall)].count("heartbeat") >= 3,
                      3 * (HEARTBEAT_S + CHECK_S + SLACK_S) + 10), since(t, wall)
    history = announced(t.log())
    beats = [(prev[0], at) for prev, (at, reason) in zip(history, history[1:]) if reason == "heartbeat" and at >= wall]
    gaps = [at - prev for prev, at in beats]
    # Each heartbeat comes heartbeat_s after the announce before it (never sooner), at most a check late.
    assert all(HEARTBEAT_S - TICK_S <= g <= HEARTBEAT_S + CHECK_S + SLACK_S for g in gaps), gaps
    assert wait_until(lambda: len(heard(arrivals, dest, start)) >= len(beats), 10), "heartbeats were not heard"


def test_pings_never_push_announces_below_the_floor(hub, arrivals, tower):
    t, dest = tower
    wall = time.time()
    # A discovery ping every 1.1 s, faster than the floor allows announces. (RNS
    # drops a second announce of one destination within the same second: its
    # emission time has 1 s resolution, so pings closer than that never arrive.)
    pinged = []
    for _ in range(5):
        pinged.append(time.time())
        hub.grid._pinger.ping()
        time.sleep(1.1)
    # The last ping is answered too, a floor after the announce before it at most.
    assert wait_until(lambda: any(at > pinged[-1] for at, _ in since(t, wall)), FLOOR_S + CHECK_S + SLACK_S + 10)
    history = since(t, wall)
    times = [at for at, _ in history]
    assert "discovery ping" in [r for _, r in history], history
    assert times[0] - pinged[0] <= FLOOR_S + SLACK_S, "a ping is answered within the floor"
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(times) >= 2 and all(g >= FLOOR_S - TICK_S for g in gaps), gaps


def test_a_new_adapter_is_announced_at_once(hub, arrivals, tower, tmp_path):
    t, dest = tower
    adapter = tmp_path / "tiny-adapter.gguf"
    adapter.write_bytes(b"GGUF" + os.urandom(4000))  # the store checks the GGUF magic only
    hub.grid.store.add_file(adapter, alias="policy-lora", kind="adapter")
    before = time.time()
    hub.grid.push("policy-lora", hub.wait_tower(t.name))
    pushed = time.time()
    assert wait_until(lambda: (e := hub.grid.table.get(dest)) and "policy-lora" in [a.alias for a in e.caps.adapters],
                      HEARTBEAT_S + CHECK_S + SLACK_S + 10), "the new adapter was not announced"
    # For the change itself, at once: no later than the floor after the announce before it allows.
    history = announced(t.log())
    change = next((k for k, (at, reason) in enumerate(history) if reason == "blob received" and at >= before), None)
    assert change is not None, history[-4:]
    previous = history[change - 1][0]
    assert history[change][0] <= max(pushed, previous + FLOOR_S) + SLACK_S, history[change - 1:change + 1]


def test_an_entry_expires_after_two_and_a_half_heartbeats(hub, arrivals, tower):
    t, dest = tower
    t.stop()
    last = heard(arrivals, dest)[-1]
    assert hub.grid.table.get(dest) is not None
    assert wait_until(lambda: hub.grid.table.get(dest) is None, EXPIRY_HEARTBEATS * HEARTBEAT_S + 10)
    gone = time.monotonic() - last
    # Not before 2.5 heartbeats of silence; after that, as soon as the table looks.
    assert EXPIRY_HEARTBEATS * HEARTBEAT_S - 0.5 <= gone <= EXPIRY_HEARTBEATS * HEARTBEAT_S + 2 * SLACK_S + 1, gone
