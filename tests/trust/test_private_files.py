"""What a tower writes is its user's alone (node/private.py): on a real tower
after a dataset was pushed to it, every file under its folder (its identity,
RNS's keys, the pushed dataset, logs, the job database) has no group or other
permission and every folder is 0700; a world-readable file left there before
it started is tightened too."""

import os
import stat

import pytest


@pytest.fixture(scope="module")
def tower(hub, tmp_path_factory):
    dataset = tmp_path_factory.mktemp("private") / "chats.jsonl"
    dataset.write_text('{"text": "a private conversation"}\n')
    hub.grid.store.add_file(dataset, alias="private-data", kind="dataset", copy=True)
    folder = hub.root / "private-t"
    folder.mkdir()
    earlier = folder / "from-an-older-version.log"
    earlier.write_text("written before the rule\n")
    earlier.chmod(0o644)
    tower = hub.start_tower("private-t", models={}, roles=("infer", "sync"))
    hub.wait_tower(tower.name)
    yield tower
    hub.stop_towers([tower])


def test_everything_a_tower_writes_is_private(hub, tower):
    hub.grid.push("private-data", tower.name)
    data = [p for p in (tower.dir / "blobs" / "objects").glob("*/data")]
    assert data and all(stat.S_IMODE(p.stat().st_mode) == 0o400 for p in data)
    keys = list((tower.dir / "rns" / "storage").rglob("*"))
    assert keys, "RNS wrote nothing under the tower's folder"
    shared = {}
    for root, dirs, files in os.walk(tower.dir):
        for name in (*dirs, *files):
            path = os.path.join(root, name)
            mode = stat.S_IMODE(os.lstat(path).st_mode)
            if not os.path.islink(path) and mode & 0o077:
                shared[os.path.relpath(path, tower.dir)] = oct(mode)
    assert not shared, shared
    assert stat.S_IMODE(tower.dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((tower.dir / "identity").stat().st_mode) == 0o600
