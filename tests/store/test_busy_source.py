"""A chunk source that is busy (its Link already serves ChunkServer.MAX_ACTIVE
chunk requests) is asked again, and every transfer completes: more pulls at
once over one Link than the tower serves at a time, on the real stack."""

import logging
import os
import threading

import blake3

from links.chunks import ChunkServer

PULLS = ChunkServer.MAX_ACTIVE + 4
SIZE = 8 << 20


def test_a_busy_source_is_asked_again_and_every_pull_completes(hub, tmp_path, caplog):
    blobs = []
    for i in range(PULLS):
        path = tmp_path / f"busy-{i}"
        path.write_bytes(os.urandom(SIZE))
        blobs.append((path, f"busy-{i}", "file", True))
    tower = hub.start_tower("busy-source", models={}, roles=("sync",), blobs=blobs)
    entry = hub.wait_tower(tower.name)
    hub.grid.connection(entry).ensure_link()  # one Link carries every pull
    results, errors = {}, []

    def pull(alias):
        try:
            results[alias] = hub.grid.pull(alias, from_tower=tower.name)
        except Exception as e:  # noqa: BLE001 - collected and asserted on below
            errors.append((alias, e))

    caplog.set_level(logging.INFO, logger="rngrid.sync")
    threads = [threading.Thread(target=pull, args=(alias,)) for _, alias, _, _ in blobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    for path, alias, _, _ in blobs:
        info, report = results[alias]
        assert blake3.blake3(info.path.read_bytes()).digest() == blake3.blake3(path.read_bytes()).digest()
        assert not report.failed_sources, report
    # More pulls than the Link serves at once: some source answered busy and was asked again.
    assert any("busy; asking it again" in r.getMessage() for r in caplog.records), \
        "no source was busy: the test did not load the Link beyond MAX_ACTIVE"
