"""Shared by the store tests: a file of random bytes, towers that hold it as a
blob, and a pull cut half-way over a shaped link."""

import contextlib
import os

from reticulum_grid.node.connection import wait_until
from testbed.lab.shaper import tcp_relay


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


@contextlib.contextmanager
def behind_a_relay(hub, source, target, rate_bps, target_roles, **source_args):
    """Tower ``source`` (hub.start_tower's ``source_args``; it grants ``target`` sync),
    then tower ``target`` with ``target_roles`` that reaches it only through the lab's
    shaping relay at ``rate_bps`` (bit/s), so a pull lasts long enough to be cut; the
    hub (not a transport node) joins neither. Yields (target, source), both heard;
    stopped when the block ends."""
    src = hub.start_tower(source, allow={hub.tower_identity(target): ["sync"]}, **source_args)
    dst = None
    try:
        with tcp_relay(src.address, rate_bps) as relay:
            dst = hub.start_tower(target, models={}, roles=target_roles, connect=[hub.address, relay])
            hub.wait_tower(src.name)
            hub.wait_tower(dst.name)
            yield dst, src
    finally:
        hub.stop_towers([t for t in (dst, src) if t])


def verified_chunks(tower):
    """Chunks the have-map of the one partial blob in ``tower``'s store marks
    verified; 0 when it keeps none."""
    partial = tower.dir / "blobs" / "partial"
    have = [p / "have" for p in partial.iterdir()] if partial.exists() else []
    return have[0].read_bytes().count(1) if have else 0


def restart(hub, tower):
    """Start the stopped ``tower`` again; its table entry once the hub heard it anew."""
    tower.start()
    # Its new announce puts the hub's path to it on the new connection.
    assert wait_until(lambda: tower.log().count("announced (start)") >= 2, 30)
    return hub.wait_tower(tower.name)
