"""A tower killed in the middle of a tower-to-tower pull resumes from its
have-map when it runs again: verified chunks are never fetched twice.

Tower A pulls from tower B over a link shaped to a few MB/s (the lab's
shaping relay), so the transfer lasts long enough to kill A half-way."""

import pytest

from links.wire import Code, WireError
from tests.store.blob_towers import behind_a_relay, random_file, restart, verified_chunks

SIZE = 24 << 20
RATE_BPS = 40_000_000  # 5 MB/s from B to A: ~5 s for the whole blob


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    return random_file(tmp_path_factory, "big.bin", SIZE)


@pytest.fixture(scope="module")
def towers(hub, blob):
    with behind_a_relay(hub, "resume-b", "resume-a", RATE_BPS, ("sync",), models={},
                        blobs=[(blob, "big", "dataset", False)]) as pair:
        yield pair


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
    kept = verified_chunks(puller)
    assert 0 < kept < SIZE >> 20, "a have-map with some chunks stays on disk"

    report = hub.grid.tower_pull(restart(hub, puller), "big", [src], alias="big", kind="dataset")
    assert report["reused"] == kept and sum(report["fetched"].values()) == report["chunks"] - kept, report
    stored = next((puller.dir / "blobs" / "objects").glob("*/data"))
    assert stored.read_bytes() == blob.read_bytes()
