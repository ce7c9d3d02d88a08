"""A tower killed in the middle of a tower-to-tower pull resumes from its
have-map when it runs again: verified chunks are never fetched twice.

Tower A pulls from tower B over a link shaped to a few MB/s (the lab's
shaping relay), so the transfer lasts long enough to kill A half-way."""


import pytest

from links.wire import Code, WireError
from reticulum_grid.node.connection import wait_until
from tests.blob_towers import random_file
from tests.lab.shaper import tcp_relay

SIZE = 24 << 20
RATE_BPS = 40_000_000  # 5 MB/s from B to A: ~5 s for the whole blob


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    return random_file(tmp_path_factory, "big.bin", SIZE)


@pytest.fixture(scope="module")
def towers(hub, blob):
    source = hub.start_tower("resume-b", models={}, blobs=[(blob, "big", "dataset", False)],
                             allow={hub.tower_identity("resume-a"): ["sync"]})
    puller = None
    try:
        with tcp_relay(source.address, RATE_BPS) as relay:
            # A reaches B only through the relay; the hub (not a transport node) joins neither.
            puller = hub.start_tower("resume-a", models={}, roles=("sync",), connect=[hub.address, relay])
            hub.wait_tower(source.name)
            hub.wait_tower(puller.name)
            yield puller, source
    finally:
        hub.stop_towers([t for t in (puller, source) if t])


def test_a_killed_pull_resumes_from_the_have_map(hub, towers, blob):
    puller, source = towers
    entry, src = hub.wait_tower(puller.name), hub.wait_tower(source.name)
    seen = []

    def progress(done, total):
        seen.append(done)
        if done >= total * 0.3 and puller.proc.poll() is None:
            puller.kill()  # SIGKILL: no chance to tidy up

    with pytest.raises(WireError) as cut:
        hub.grid.tower_pull(entry, "big", [src], alias="big", kind="dataset", progress=progress)
    assert puller.proc.poll() is not None, f"the pull ended before the kill (progress {seen[-3:]})"
    # What a client sees when the tower it follows dies: its Link went, not a refusal.
    assert cut.value.code == Code.UNREACHABLE and "link" in cut.value.message, cut.value
    partial = puller.dir / "blobs" / "partial"
    have = [p / "have" for p in partial.iterdir()] if partial.exists() else []
    assert have and 0 < have[0].read_bytes().count(1) < SIZE >> 20, "a have-map with some chunks stays on disk"
    kept = have[0].read_bytes().count(1)

    puller.start()
    # Its new announce puts the hub's path to it on the new connection.
    assert wait_until(lambda: puller.log().count("announced (start)") >= 2, 30)
    report = hub.grid.tower_pull(hub.wait_tower(puller.name), "big", [src], alias="big", kind="dataset")
    assert report["reused"] == kept and sum(report["fetched"].values()) == report["chunks"] - kept, report
    stored = next((puller.dir / "blobs" / "objects").glob("*/data"))
    assert stored.read_bytes() == blob.read_bytes()
