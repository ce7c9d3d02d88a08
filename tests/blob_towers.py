"""Shared by the store tests: a file of random bytes, and towers that hold it as a blob."""

import contextlib
import os


def random_file(tmp_path_factory, name, size):
    """A new file ``name`` of ``size`` random bytes (incompressible, unlike any other test's)."""
    path = tmp_path_factory.mktemp("blobs") / name
    path.write_bytes(os.urandom(size))
    return path


@contextlib.contextmanager
def holding(hub, path, alias, *names, roles=("infer", "sync"), **sections):
    """Towers ``names`` that hold ``path`` as the dataset blob ``alias``, heard by the hub;
    stopped when the block ends (a list, in the order named)."""
    towers = []
    try:
        for name in names:
            towers.append(hub.start_tower(name, models={}, roles=roles, blobs=[(path, alias, "dataset", False)],
                                          **sections))
        for tower in towers:
            hub.wait_tower(tower.name)
        yield towers
    finally:
        hub.stop_towers(towers)
