"""Routing v1 order: loaded model, then most free memory, then fewest hops."""

import pytest

from announce import caps as c
from announce.table import TowerEntry, TowerTable
from links.wire import WireError
from reticulum_grid import router


def entry(name, free_vram=0, free_ram=1000, hops=1, loaded=True, model="m"):
    hw = c.Hardware("cuda" if free_vram else "cpu", "d", 32000 if free_vram else 0, free_vram, 64000, free_ram)
    caps = c.Caps(name=name, hardware=hw, models=(c.ModelCap(model, b"abcd", loaded),))
    return TowerEntry(name.encode().ljust(16, b"\0"), caps, hops, 0.0)


@pytest.mark.parametrize("entries, expected", [
    ([entry("a", free_vram=8000), entry("b", free_vram=20000)], "b"),
    ([entry("a", free_vram=20000, hops=3), entry("b", free_vram=20000, hops=1)], "b"),
    ([entry("a", free_vram=30000, loaded=False), entry("b", free_vram=2000)], "b"),
    ([entry("cpu", free_ram=60000), entry("gpu", free_vram=30000)], "cpu"),
    ([entry("a", model="other"), entry("b")], "b"),
])
def test_choose(entries, expected):
    assert router.choose(entries, "m").name == expected


def test_no_candidate():
    with pytest.raises(WireError) as e:
        router.choose([entry("a", model="other")], "m")
    assert e.value.code == "no_tower"


def test_table_expiry_and_lookup():
    now = [1000.0]
    table = TowerTable(clock=lambda: now[0])
    caps = c.Caps(name="alpha", heartbeat_s=100)
    table.update(b"\x01" * 16, caps, 2)
    assert table.find("alpha").hops == 2 and table.find("01010101").name == "alpha"
    now[0] += 249
    assert table.live()
    now[0] += 2
    assert not table.live() and table.find("alpha") is None
