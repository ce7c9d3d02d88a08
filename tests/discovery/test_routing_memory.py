"""Routing by free memory between real towers: a tower whose container (a
memory cgroup, node/cgroup.py) leaves less room than the model needs ranks
after one with room, and requests run on the one with room.

Both towers hold the model on disk, not loaded (``preload = false``; a
loaded model is routed by its load instead), so the router's ``no_room`` key
decides."""

import pytest

from announce.caps import decode_full
from reticulum_grid.client import Usage
from reticulum_grid.inference.default_model import default_model_path
from reticulum_grid.node.connection import wait_until
from testbed.cgroups import child_group
from testbed.requirements import need

MODEL = "room-model"
PROMPT = "Count from 1 to 500, separated by commas: 1, 2, 3,"
#: The tight tower's limit (bytes): below the model's need (~311 MiB) even with none of the tower's
#: own memory counted in it. The tower moves in after it started, and a memory cgroup keeps the pages
#: a process touched before it moved charged where they were: 360 MiB once left it 328 MiB free.
LIMIT = 288 << 20


def free_mib(hub, name):
    caps = decode_full(hub.grid.connection(hub.wait_tower(name)).request("caps/full", {})["caps"])
    return caps.hardware.ram_free_mib


@pytest.fixture(scope="module")
def towers(hub):
    need("memory-cgroup", "a tower in a container with a memory limit")
    with child_group("tight", LIMIT) as move:
        # Not preloaded: on disk on both, so room decides (a loaded model is routed by its load).
        model = {"path": default_model_path(), "preload": False}
        made = [hub.start_tower(name, models={MODEL: model}) for name in ("room-big", "room-tight")]
        try:
            move(made[1].proc.pid)  # before its first request: the runner it starts stays inside too
            yield made
        finally:
            hub.stop_towers(made)


def test_the_tower_without_room_ranks_last_and_requests_run_where_there_is_room(hub, towers):
    big, tight = towers
    # The client learns the model's need from the towers' caps/full (routing compares free memory with it).
    # (a tower reads a model's facts from its GGUF in the background, seconds after it starts).
    entries = [hub.wait_tower(big.name), hub.wait_tower(tight.name)]
    assert wait_until(lambda: hub.grid.caps_full(entries) and hub.grid.needs.get(MODEL, 0) > 0, 30)
    need_mib = hub.grid.needs[MODEL]
    # The tight tower tells its limit, not the machine's memory.
    assert wait_until(lambda: free_mib(hub, tight.name) < need_mib, 30), (free_mib(hub, tight.name), need_mib)
    assert free_mib(hub, big.name) > need_mib
    for _ in range(5):  # equal towers would each come first half the time
        ranked = hub.grid.rank(MODEL)
        assert [c.entry.name for c in ranked] == [big.name, tight.name], [c.reasons for c in ranked]
        assert ranked[1].reasons["no_room"] and not ranked[0].reasons["no_room"]
        assert ranked[0].reasons["tier"] == ranked[1].reasons["tier"] == "on disk"
    pieces = list(hub.grid.execute("ai/inference", {"model": MODEL, "prompt": PROMPT, "max_tokens": 4,
                                                    "temperature": 0.0}))
    assert isinstance(pieces[-1], Usage) and pieces[-1].tower == big.name
    assert "llama-server" not in tight.log(), "the tower without room never started a runner"
