"""When a tower announces: start, material change, ping, heartbeat, never under the floor.

Unit tests with a named test double for the RNS Destination; real announces
are covered in test_discovery.py and test_announce.py."""

import time

from announce import caps as c
from announce.announcer import Announcer


class DestinationDouble:
    """Test double for RNS.Destination: records announce times."""

    def __init__(self):
        self.times = []

    def announce(self, app_data=None):
        c.decode(app_data)
        self.times.append(time.monotonic())


def wait_count(dest, n, timeout=10.0):
    deadline = time.monotonic() + timeout
    while len(dest.times) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return len(dest.times)


def test_start_ping_floor_and_material_change():
    dest = DestinationDouble()
    state = {"caps": c.Caps(name="t", models=(c.ModelCap("m", b"abcd", True),))}
    a = Announcer(dest, lambda: state["caps"], heartbeat_s=3600, floor_s=0.4, check_s=0.05)
    a.start()
    try:
        assert wait_count(dest, 1) == 1 and a.last_reason == "start"
        for _ in range(5):
            a.request("discovery ping")  # a burst of pings: one announce, after the floor
        assert wait_count(dest, 2) == 2 and a.last_reason == "discovery ping"
        assert dest.times[1] - dest.times[0] >= 0.39
        time.sleep(0.6)
        assert len(dest.times) == 2, "no announce without a reason"
        state["caps"] = c.Caps(name="t", load=c.Load(streams=3))  # models changed
        assert wait_count(dest, 3) == 3 and a.last_reason == "material change"
        state["caps"] = c.Caps(name="t", load=c.Load(streams=0, queue=5))  # live load only
        time.sleep(0.6)
        assert len(dest.times) == 3, "live load is not announced"
    finally:
        a.stop()


def test_heartbeat():
    dest = DestinationDouble()
    a = Announcer(dest, lambda: c.Caps(name="t"), heartbeat_s=0.3, floor_s=0.1, check_s=0.05)
    a.start()
    try:
        assert wait_count(dest, 3) == 3
        assert a.last_reason == "heartbeat"
        assert all(b - a_ >= 0.3 - 0.001 for a_, b in zip(dest.times, dest.times[1:3])), dest.times
    finally:
        a.stop()


def test_radio_budget_caps_announces_per_window():
    """On radio a tower sends at most ``budget`` announces per window, however
    many pings and changes ask; the next waits until the oldest leaves the window."""
    dest = DestinationDouble()
    caps = c.Caps(name="t", models=(c.ModelCap("m", b"abcd", True),))
    a = Announcer(dest, lambda: caps, heartbeat_s=3600, floor_s=0.0, check_s=0.02, budget=3, budget_window_s=0.6)
    a.start()
    try:
        for _ in range(8):
            a.request("discovery ping")
            time.sleep(0.03)
        assert wait_count(dest, 4) >= 4  # the window moved on
        # However late this thread ran (a slow loop lets later windows announce too), no
        # four announces ever fell within one window.
        times = list(dest.times)
        assert all(b - a_ >= 0.6 - 0.001 for a_, b in zip(times, times[3:])), times
    finally:
        a.stop()
