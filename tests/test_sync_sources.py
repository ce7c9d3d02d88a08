"""A tower asked to fetch a blob from other towers gets at most
MAX_PULL_SOURCES of them (it refuses more), the ones that answered lately
first and then the nearest. Found when a long-lived client had heard more
than 16 towers holding one model (the whole test session). BlobTransfers.sync_to
runs on a test double of the Grid's table and health book; tower_pull records
the sources it was given."""

from types import SimpleNamespace

import pytest

from links.chunks import MAX_PULL_SOURCES
from reticulum_grid.client.router import HealthBook
from reticulum_grid.client.transfers import BlobTransfers


class Named(Exception):
    pass


class GridDouble(BlobTransfers):
    def __init__(self, entries):
        self.table = SimpleNamespace(live=lambda: entries)
        self.health = HealthBook()

    def local_blob(self, name):
        return None

    def tower_pull(self, entry, name, sources, **kwargs):
        raise Named(sources)


def tower(i, hops):
    return SimpleNamespace(name=f"t{i}", destination_hash=bytes([i]) * 16, hops=hops,
                           caps=SimpleNamespace(model=lambda name: object()))


def test_a_pull_names_at_most_the_sources_a_tower_accepts():
    target, holders = tower(0, 1), [tower(i, 1 + i % 3) for i in range(1, 21)]
    grid = GridDouble([target, *holders])
    for failed in holders[:5]:
        grid.health.failed(failed.destination_hash, "gone", lost=True)
    with pytest.raises(Named) as named:
        grid.sync_to(target, "m")
    sources = named.value.args[0]
    assert len(sources) == MAX_PULL_SOURCES and target not in sources
    assert not any(grid.health.get(s.destination_hash).backed_off() for s in sources[:15]), "answering ones first"
    hops = [s.hops for s in sources[:15]]
    assert hops == sorted(hops), "then the nearest"
