"""Placement (split/plan.py) as a scenario table: a pure function, no network."""

import pytest

from reticulum_grid.split.plan import Offer, PlanError, plan

GB = 1024


def offers(*specs):
    """Offers from (name, lend GiB[, field=value...]) tuples."""
    return [Offer(name, name.encode().ljust(16, b"\0"), int(gib * GB), **extra) for name, gib, *rest in specs
            for extra in [rest[0] if rest else {}]]


SCENARIOS = [
    # (what, offers, model MiB, layers, towers expected: workers first, coordinator last)
    ("32+24+8 GB and a 40 GB model: two towers, the biggest coordinates",
     offers(("g5090", 32), ("g3090", 24), ("laptop", 8)), 40 * GB, 80, ["g3090", "g5090"]),
    ("a tower that is training is used last",
     offers(("g5090", 32), ("busy", 24, {"training": True}), ("g4080", 16)), 40 * GB, 80, ["g4080", "g5090"]),
    ("a tower 3 hops away is used last",
     offers(("g5090", 32), ("far", 24, {"hops": 3}), ("near", 16)), 40 * GB, 80, ["near", "g5090"]),
    ("lower RTT wins among equals",
     offers(("big", 32), ("slow-link", 24, {"rtt_s": 0.2}), ("fast-link", 24, {"rtt_s": 0.01})), 40 * GB, 80,
     ["fast-link", "big"]),
    ("the training tower still serves when nothing else is enough",
     offers(("g5090", 32), ("busy", 24, {"training": True}), ("laptop", 8)), 40 * GB, 80, ["busy", "g5090"]),
    ("one tower that fits is a plan without workers",
     offers(("big", 48), ("small", 8)), 40 * GB, 80, ["big"]),
    ("three small towers for one model",
     offers(("a", 16), ("b", 16), ("c", 16, {"has_model": True})), 40 * GB, 64, ["a", "b", "c"]),
    ("a set with the GGUF's holder beats one that needs a copy, whatever the RTT",
     offers(("holder", 16, {"rtt_s": 0.3, "has_model": True}), ("p", 16), ("q", 16)), 20 * GB, 30, ["p", "holder"]),
    ("fewest towers beat preference: two big ones rather than three near ones",
     offers(("x", 30, {"hops": 2}), ("y", 30, {"hops": 2}), ("n1", 12), ("n2", 12), ("n3", 12)), 40 * GB, 80,
     ["y", "x"]),
]


@pytest.mark.parametrize("what, towers, need, layers, expected", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_plan_scenarios(what, towers, need, layers, expected):
    placement = plan(towers, need, layers)
    assert placement.towers == expected, what
    # Layers cover the model in order, each tower's share fits what it lends,
    # and shares follow lent memory.
    assert placement.parts[0].first == 0 and placement.parts[-1].end == layers
    assert all(a.end == b.first for a, b in zip(placement.parts, placement.parts[1:]))
    assert all(p.mib <= p.offer.lend_mib for p in placement.parts)
    assert sum(p.offer.lend_mib for p in placement.parts) >= need * 1.1
    biggest = max(placement.parts, key=lambda p: p.offer.lend_mib)
    smallest = min(placement.parts, key=lambda p: p.offer.lend_mib)
    assert biggest.layers >= smallest.layers
    assert placement.coordinator is placement.parts[-1]
    assert placement.reasons


def test_layers_follow_lent_memory_exactly():
    placement = plan(offers(("g5090", 32), ("g3090", 24)), 40 * GB, 80)
    assert [(p.offer.name, p.first, p.end) for p in placement.parts] == [("g3090", 0, 34), ("g5090", 34, 80)]


def test_equal_lenders_pick_the_holder_as_coordinator():
    placement = plan(offers(("a", 16), ("b", 16, {"has_model": True})), 20 * GB, 30)
    assert placement.coordinator.offer.name == "b"


def test_nothing_fits_says_how_much_is_missing():
    with pytest.raises(PlanError, match="offer 16384 MiB"):
        plan(offers(("a", 8), ("b", 8), ("c", 0)), 40 * GB, 80)


def test_bad_model_facts_are_refused():
    with pytest.raises(PlanError):
        plan(offers(("a", 8)), 1024, 0)


def test_plan_as_plain_data():
    data = plan(offers(("g5090", 32), ("g3090", 24)), 40 * GB, 80).to_map()
    assert [p["role"] for p in data["parts"]] == ["worker", "coordinator"]
    assert data["n_layers"] == 80 and data["need_mib"] == 40 * GB


def test_lent_memory_rides_in_the_caps_and_absurd_values_are_refused():
    import msgpack
    from announce import caps
    blob = caps.encode(caps.Caps(name="t", lend_mib=24 * GB))
    assert caps.decode(blob).lend_mib == 24 * GB and len(blob) < caps.CAPS_BUDGET
    assert caps.decode(caps.encode(caps.Caps(name="t"))).lend_mib is None  # a tower that says nothing
    raw = msgpack.unpackb(blob)
    for bad in (-1, 1 << 40, "lots", True):
        with pytest.raises(caps.CapsError):
            caps.decode(msgpack.packb({**raw, "sh": bad}))


def test_shard_table_in_tower_toml(tmp_path):
    from reticulum_grid.node import config
    path = tmp_path / "tower.toml"
    config.write_tower(path, "t", {}, shard={"lend_mib": 512, "threads": 2})
    loaded = config.load_tower(path)
    assert (loaded.lend_mib, loaded.shard_threads) == (512, 2) and "shard" in config.ROLES
    config.write_tower(path, "t", {})
    assert config.load_tower(path).lend_mib is None  # unset: free memory minus a headroom
    config.write_tower(path, "t", {}, shard={"lend_mib": -5})
    with pytest.raises(config.ConfigError, match="lend_mib"):
        config.load_tower(path)
    config.write_tower(path, "t", {}, shard={"yield_idle_s": 30})
    assert config.load_tower(path).shard_yield_idle_s == 30
    config.write_tower(path, "t", {}, shard={"yield_idle_s": 0})  # 0 would let any coordinator take a plan in use
    with pytest.raises(config.ConfigError, match="yield_idle_s"):
        config.load_tower(path)
