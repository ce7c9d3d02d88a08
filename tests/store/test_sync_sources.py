"""A tower asked to fetch a blob from other towers gets at most
MAX_PULL_SOURCES of them (it refuses more), the ones that answered lately
first and then the nearest. Found when a long-lived client had heard more
than 16 towers holding one model (the whole test session). BlobTransfers.sync_to
runs on a test double of the Grid's table and health book; tower_pull records
the sources it was given. The tower's side runs on real towers: it refuses
one source more than it accepts, and a pull naming as many as it accepts
(one holder, the rest towers nobody heard) completes from the holder."""

import os
from types import SimpleNamespace

import pytest

from links.chunks import MAX_PULL_SOURCES
from links.wire import Code, WireError
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


def test_a_real_tower_takes_at_most_max_pull_sources(hub, tmp_path):
    blob = tmp_path / "many-sources.bin"
    blob.write_bytes(os.urandom(3 << 20))
    holder = hub.start_tower("src-holder", models={}, blobs=[(blob, "many-sources", "dataset", False)],
                             allow={hub.tower_identity("src-puller"): ["sync"]})
    # The puller reaches the holder directly: the hub's RNS is no transport node.
    puller = hub.start_tower("src-puller", models={}, roles=("sync",), connect=[hub.address, holder.address])
    try:
        source, target = hub.wait_tower(holder.name), hub.wait_tower(puller.name)
        strangers = [SimpleNamespace(name=f"stranger-{i}", destination_hash=os.urandom(16))
                     for i in range(MAX_PULL_SOURCES)]
        with pytest.raises(WireError) as refused:
            hub.grid.tower_pull(target, "many-sources", [source, *strangers], alias="many-sources", kind="dataset")
        assert refused.value.code == Code.BAD_REQUEST and f"1..{MAX_PULL_SOURCES}" in refused.value.message, \
            refused.value
        report = hub.grid.tower_pull(target, "many-sources", [source, *strangers[:MAX_PULL_SOURCES - 1]],
                                     alias="many-sources", kind="dataset")
        assert sum(report["fetched"].values()) == report["chunks"], report
        stored = next((puller.dir / "blobs" / "objects").glob("*/data"))
        assert stored.read_bytes() == blob.read_bytes()
    finally:
        puller.stop()
        holder.stop()
