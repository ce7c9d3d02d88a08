"""A client on a radio-class interface sends discovery pings at most once a
RADIO_PING_INTERVAL_S, forced or not; elsewhere forced pings may come every
PING_FLOOR_S (client/grid.py). Grid.ping runs on a test double of the Grid's
state (its pinger counts pings), with the real clock."""

import time
from types import SimpleNamespace

from reticulum_grid.client import grid as gridmod


class CountingPinger:
    def __init__(self):
        self.sent = 0

    def ping(self):
        self.sent += 1


def state(on_radio):
    return SimpleNamespace(_last_ping=float("-inf"), _on_radio=on_radio, _told_offline=False,
                           _pinger=CountingPinger())


def test_forced_pings_are_spaced_by_the_floor_off_radio(monkeypatch):
    monkeypatch.setattr(gridmod, "PING_FLOOR_S", 0.2)
    s = state(on_radio=False)
    gridmod.Grid.ping(s, force=True)
    gridmod.Grid.ping(s, force=True)
    time.sleep(0.25)
    gridmod.Grid.ping(s, force=True)
    assert s._pinger.sent == 2


def test_radio_pings_wait_the_radio_interval_even_when_forced(monkeypatch):
    monkeypatch.setattr(gridmod, "PING_FLOOR_S", 0.2)
    monkeypatch.setattr(gridmod, "RADIO_PING_INTERVAL_S", 3.0)
    s = state(on_radio=True)
    gridmod.Grid.ping(s, force=True)
    time.sleep(0.25)
    gridmod.Grid.ping(s, force=True)  # past the floor, within the radio interval: not sent
    assert s._pinger.sent == 1
    time.sleep(3.0)
    gridmod.Grid.ping(s)
    assert s._pinger.sent == 2
