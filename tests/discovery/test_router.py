"""The routing score (router.py), as a scenario table; and the tower table."""

import msgpack
import pytest

from announce import caps as c
from announce.table import TowerEntry, TowerTable
from links.wire import WireError
from reticulum_grid.client import router


def entry(name, free_vram=0, free_ram=1000, hops=1, loaded=True, model="m", streams=0, queue=0, jobs=0, tps=100.0,
          adapters=()):
    hw = c.Hardware("cuda" if free_vram else "cpu", "d", 32000 if free_vram else 0, free_vram, 64000, free_ram)
    models = (c.ModelCap(model, b"abcd", loaded),) if model else ()
    caps = c.Caps(name=name, hardware=hw, models=models, load=c.Load(streams, jobs, queue), tokens_per_s=tps,
                  adapters=tuple(c.AdapterCap(a, b"\x01\x02\x03\x04") for a in adapters))
    return TowerEntry(name.encode().ljust(16, b"\0"), caps, hops, 0.0)


def backed_off(*names):
    book = router.HealthBook()
    for name in names:
        book.failed(name.encode().ljust(16, b"\0"))
    return book


@pytest.mark.parametrize("case, entries, expected, options", [
    ("more free memory", [entry("a", free_vram=8000), entry("b", free_vram=20000)], "b", {}),
    ("fewer hops", [entry("a", free_vram=20000, hops=3), entry("b", free_vram=20000, hops=1)], "b", {}),
    ("loaded beats on disk", [entry("a", free_vram=30000, loaded=False), entry("b", free_vram=2000)], "b", {}),
    ("model only on b", [entry("a", model="other"), entry("b")], "b", {}),
    ("a is training", [entry("a", free_vram=30000, jobs=1), entry("b", free_vram=1000)], "b", {}),
    ("training only if nothing else", [entry("a", jobs=1), entry("b", model="other")], "a", {}),
    ("busy tower loses to idle one", [entry("a", streams=1, queue=2), entry("b")], "b", {}),
    ("fast busy vs slow idle", [entry("a", streams=1, tps=400.0), entry("b", tps=100.0)], "a", {}),
    ("failed tower backed off", [entry("a", free_vram=30000), entry("b")], "b", {"failed": ["a"]}),
    ("backed off still used last", [entry("a")], "a", {"failed": ["a"]}),
    ("does not fit", [entry("a", free_ram=1000, loaded=False), entry("b", free_ram=9000, loaded=False)], "b",
     {"need_mib": 4000}),
    ("has the adapter", [entry("a", free_vram=30000), entry("b", adapters=("sql",))], "b", {"adapter": "sql"}),
    ("sync target when nobody has it", [entry("a", model=None, free_ram=100), entry("b", model=None, free_ram=900)],
     "b", {"syncable": True}),
])
def test_scenarios(case, entries, expected, options):
    options = dict(options)
    if "failed" in options:  # built now: a backoff lasts seconds
        options["health"] = backed_off(*options.pop("failed"))
    assert router.choose(entries, "m", **options).name == expected, case
    assert router.rank(entries, "m", **options)[0].entry.name == expected


def test_no_candidate():
    with pytest.raises(WireError) as e:
        router.choose([entry("a", model="other")], "m")
    assert e.value.code == "no_tower"


def test_reasons_explain_the_order():
    ranked = router.rank([entry("a", jobs=1), entry("b", loaded=False)], "m")
    assert [c.entry.name for c in ranked] == ["b", "a"]
    assert ranked[0].reasons["tier"] == "on disk" and ranked[1].reasons["training"] is True


def test_equal_towers_share_the_load():
    firsts = {router.choose([entry("a"), entry("b")], "m").name for _ in range(50)}
    assert firsts == {"a", "b"}


def test_backoff_grows_and_resets():
    book = router.HealthBook()
    key = b"x" * 16
    book.failed(key)
    first = book.get(key).backoff_until
    book.failed(key)
    assert book.get(key).backoff_until > first and book.get(key).backed_off()
    book.succeeded(key)
    assert not book.get(key).backed_off()


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


def test_a_name_two_towers_announce_matches_neither():
    table = TowerTable()
    table.update(b"\x01" * 16, c.Caps(name="tower"), 1)
    table.update(b"\x02" * 16, c.Caps(name="tower"), 1)
    assert table.find("tower") is None and len(table.named("tower")) == 2
    assert table.find("02" * 16).destination_hash == b"\x02" * 16


def test_caps_stamped_earlier_than_those_held_are_dropped():
    """Field case: a training tower's caps/full said one job, then its announce
    from a second before the job started came through the transport node and
    the tower ranked as idle (tests/discovery/test_routing.py, under load)."""
    from announce.table import MAX_REORDER_S
    key, at = b"\x01" * 16, 1_800_000_000_000
    table = TowerTable()
    table.update(key, c.Caps(name="a", load=c.Load(jobs=0), at_ms=at), 2)
    assert table.refresh_caps(key, c.Caps(name="a", load=c.Load(jobs=1), at_ms=at + 900)).caps.load.jobs == 1
    assert table.update(key, c.Caps(name="a", load=c.Load(jobs=0), at_ms=at + 800), 2).caps.load.jobs == 1
    assert table.refresh_caps(key, c.Caps(name="a", load=c.Load(jobs=0), at_ms=at + 850)).caps.load.jobs == 1
    assert table.update(key, c.Caps(name="a", load=c.Load(jobs=0), at_ms=at + 901), 2).caps.load.jobs == 0
    # Restarted with its clock set back further than any late forward: taken.
    restarted = at + 901 - int(MAX_REORDER_S * 1000) - 1
    assert table.update(key, c.Caps(name="a", load=c.Load(jobs=1), at_ms=restarted), 2).caps.load.jobs == 1
    assert table.update(key, c.Caps(name="a", load=c.Load(jobs=0)), 2).caps.load.jobs == 0  # unstamped: taken


def test_a_stamp_survives_encoding_and_a_tower_never_stamps_backwards():
    caps = c.Caps(name="a", at_ms=c.stamp_ms())
    assert c.decode(c.encode(caps)).at_ms == caps.at_ms and c.decode(c.encode(c.Caps(name="a"))).at_ms == 0
    stamps = [c.stamp_ms() for _ in range(1000)]
    assert stamps == sorted(stamps)
    with pytest.raises(c.CapsError):
        c.from_map({**msgpack.unpackb(c.encode(caps)), "at": -1})
