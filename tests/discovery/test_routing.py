"""Routing, failover and busy towers on a real topology: three towers behind an
RNS transport node, the client on the other side (two hops)."""

import time

import pytest

from links.wire import Code, WireError
from reticulum_grid.client import Usage
from reticulum_grid.inference.default_model import DEFAULT_ALIAS, default_model_path
from reticulum_grid.node.localgrid import TransportProcess

AB = "ab-model"  # the same GGUF, under an alias only towers A and B have
PROMPT = "Count from 1 to 500, separated by commas: 1, 2, 3,"


@pytest.fixture(scope="module")
def grid(hub):
    transport = TransportProcess(hub.root, "route-transport", connect=[hub.address]).start()
    gguf = default_model_path()
    towers = {}
    try:
        yield _route_towers(hub, transport, gguf, towers)
    finally:
        # Towers behind the transport node go with it, whatever failed on the way.
        for tower in towers.values():
            tower.stop()
        transport.stop()


def _route_towers(hub, transport, gguf, towers):
    one = {"path": gguf, "parallel": 1}  # one slot and queue_depth 0: one stream fills A or B
    towers.update({
        "A": hub.start_tower("tower-A", models={DEFAULT_ALIAS: one, AB: one}, connect=[transport.address],
                             roles=("infer", "sync", "train"), limits={"queue_depth": 0}),
        "B": hub.start_tower("tower-B", models={DEFAULT_ALIAS: one, AB: one, "only-b": one},
                             connect=[transport.address], limits={"queue_depth": 0}),
        "C": hub.start_tower("tower-C", models={DEFAULT_ALIAS: gguf}, connect=[transport.address]),
    })
    for t in towers.values():
        assert hub.wait_tower(t.name).hops == 2, "towers are reached through the transport node"
    return towers


def run(hub, model, **extra):
    stream = hub.grid.execute("ai/inference", {"model": model, "prompt": PROMPT, "max_tokens": 8,
                                               "temperature": 0.0, **extra})
    pieces = list(stream)
    assert isinstance(pieces[-1], Usage)
    return "".join(pieces[:-1]), pieces[-1]


def test_model_only_on_b_goes_to_b(hub, grid):
    text, usage = run(hub, "only-b")
    assert usage.tower == "tower-B" and text


def test_training_tower_is_avoided(hub, grid, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "The secret word is PERIWINKLE-77."}\n' * 4)
    _, job = hub.grid.train({"base": AB, "dataset": "", "output_alias": "busy-lora", "max_steps": 400,
                             "seq_len": 32, "batch_size": 2}, data_path=data, tower="tower-A")
    try:
        deadline = time.monotonic() + 60
        while not hub.grid.rank(AB)[-1].reasons["training"] and time.monotonic() < deadline:
            time.sleep(0.5)
        ranked = hub.grid.rank(AB)
        assert [c.entry.name for c in ranked] == ["tower-B", "tower-A"] and ranked[1].reasons["training"]
        for _ in range(3):
            usage = run(hub, AB)[1]
            b = hub.grid.health.get(hub.grid.table.find("tower-B").destination_hash)
            assert usage.tower == "tower-B", f"failovers {usage.failovers}; B's health: {b}"
    finally:
        hub.grid.cancel_job(job, tower="tower-A")


def test_all_busy_is_a_clear_error(hub, grid):
    # queue_depth 0 on A and B: one stream each fills them.
    long = [iter(hub.grid.execute("ai/inference", {"model": AB, "prompt": PROMPT, "max_tokens": 3000,
                                                   "temperature": 0.0})) for _ in range(2)]
    try:
        for stream in long:
            next(stream)
        with pytest.raises(WireError) as e:
            run(hub, AB)
        assert e.value.code == Code.BUSY and "all 2 towers" in e.value.message and e.value.retry_after > 0
    finally:
        for stream in long:
            stream.close()


def test_a_busy_reply_sends_the_request_to_the_other_tower(hub, grid):
    """A asks first (as a client whose reading of A's load is stale would) and answers
    busy (queue_depth 0, one stream running): the same request goes on to B at once."""
    from reticulum_grid.client.stream import InferenceStream
    from tests.gateway_support import wait_idle
    busy = grid["A"]
    assert all(wait_idle(hub, t, timeout=30) for t in (grid["A"], grid["B"])), "streams left running"
    hold = iter(hub.grid.execute("ai/inference", {"model": AB, "prompt": PROMPT, "max_tokens": 3000,
                                                  "temperature": 0.0}, tower=busy.name))
    try:
        next(hold)
        refusals = busy.log().count("ai/inference refused: busy")
        ranked = sorted(hub.grid.rank(AB), key=lambda choice: choice.entry.name != busy.name)
        assert [c.entry.name for c in ranked] == ["tower-A", "tower-B"]
        payload = {"model": AB, "prompt": PROMPT, "max_tokens": 8, "temperature": 0.0}
        pieces = list(InferenceStream(hub.grid, payload, ranked))
        assert pieces[-1].tower == "tower-B" and pieces[-1].completion_tokens == 8
        assert busy.log().count("ai/inference refused: busy") == refusals + 1, "A was never asked"
    finally:
        hold.close()


def test_killed_mid_stream_continues_on_the_other_tower(hub, grid, reference):
    expected = reference.completion(PROMPT, 240)
    stream = hub.grid.execute("ai/inference", {"model": AB, "prompt": PROMPT, "max_tokens": 240,
                                               "temperature": 0.0})
    pieces, killed = [], None
    for piece in stream:
        pieces.append(piece)
        if len(pieces) == 40:
            killed = next(t for t in grid.values() if t.name == stream.tower)
            killed.kill()
    usage = pieces[-1]
    assert "".join(pieces[:-1]) == expected, "the joined text equals an uninterrupted run"
    assert usage.failovers == 1 and usage.tower != killed.name and usage.completion_tokens == 240
    old = hub.grid.table.find(killed.name).destination_hash
    hub.grid.table.remove(old)
    killed.start()
    hub.wait_tower(killed.name)


def test_killed_before_the_first_token_goes_elsewhere(hub, grid):
    hub.grid.health.succeeded(hub.wait_tower("tower-A").destination_hash)
    hub.grid.health.succeeded(hub.wait_tower("tower-B").destination_hash)
    stream = hub.grid.execute("ai/inference", {"model": AB, "prompt": PROMPT, "max_tokens": 8, "temperature": 0.0})
    first = stream.choices[0].entry.name
    victim = next(t for t in grid.values() if t.name == first)
    victim.kill()  # after routing, before the request reaches it
    pieces = list(stream)
    assert pieces[-1].tower != first and "".join(pieces[:-1])
    # The failure is on record (its backoff, 2 s after a first failure, may be over by now on a busy machine).
    health = hub.grid.health.get(stream.choices[0].entry.destination_hash)
    assert health.failures >= 1 and health.state in ("silent", "failed"), health
