"""Failover at its edges, on real towers killed with SIGKILL mid-stream:
chat requests, stop strings, and no tower left.

fo-a and fo-b hold the same GGUF as ``fo-model``; only fo-a has ``solo-model``.
Two edges are not provoked here because a test cannot aim the kill: between
the bytes of a multibyte character (the client sees decoded text only; the
decoder itself is in test_stream_codec.py), and after the last token but
before the end message (tried: the end message had always arrived by the
time the last text reached the test, so the kill proved nothing)."""

import pytest

from links.wire import Code, WireError
from reticulum_grid.client import Usage
from reticulum_grid.inference.default_model import default_model_path

CHAT = [{"role": "user", "content": "List twenty fruits, one per line, with a short note on each."}]
PROMPT = "Count from 1 to 500, separated by commas: 1, 2, 3,"


@pytest.fixture(scope="module")
def towers(hub):
    gguf = default_model_path()
    made = {"fo-a": hub.start_tower("fo-a", models={"fo-model": gguf, "solo-model": gguf}),
            "fo-b": hub.start_tower("fo-b", models={"fo-model": gguf})}
    for name in made:
        hub.wait_tower(name)
    yield made
    for tower in made.values():
        tower.stop()


def revive(hub, tower):
    """Start a killed tower again and make it routable."""
    entry = hub.grid.table.find(tower.name)
    if entry is not None:
        hub.grid.table.remove(entry.destination_hash)
    tower.start()
    hub.grid.health.succeeded(hub.wait_tower(tower.name).destination_hash)


def stream(hub, **payload):
    return hub.grid.execute("ai/inference", {"temperature": 0.0, **payload})


def run_killing(towers, stream_, when, box):
    """Collect a stream, SIGKILLing its tower once ``when(pieces)`` holds; the
    pieces and the killed tower go in ``box`` (also when the stream raises)."""
    pieces = box.setdefault("pieces", [])
    for piece in stream_:
        pieces.append(piece)
        if "killed" not in box and not isinstance(piece, Usage) and when(pieces):
            box["killed"] = towers[stream_.tower]
            box["killed"].kill()
    return pieces, box.get("killed")


def test_a_chat_request_fails_over_to_the_same_text(hub, towers):
    request = {"model": "fo-model", "messages": CHAT, "max_tokens": 80}
    reference = list(stream(hub, **request))
    pieces, killed = run_killing(towers, stream(hub, **request), lambda p: len(p) == 30, {})
    try:
        assert killed is not None, "the stream ended before the kill"
        usage = pieces[-1]
        assert "".join(pieces[:-1]) == "".join(reference[:-1]), "chat text across a failover equals one run"
        assert usage.failovers == 1 and usage.tower != killed.name and usage.completion_tokens == 80
    finally:
        revive(hub, killed)


def test_stop_strings_are_never_continued_elsewhere(hub, towers):
    s = stream(hub, model="fo-model", prompt=PROMPT, max_tokens=200, stop=["never appears here"])
    box = {}
    with pytest.raises(WireError) as e:
        run_killing(towers, s, lambda p: len(p) == 20, box)
    killed = box.get("killed")
    try:
        assert killed is not None, "the tower was not killed"
        assert e.value.code in (Code.UNREACHABLE, Code.TIMEOUT), e.value
        assert "stop strings cannot be continued elsewhere" in e.value.message
        assert f"after {len(s.ids)} tokens ({len(s.text)} characters)" in e.value.message and s.ids
    finally:
        if killed is not None:
            revive(hub, killed)


def test_no_tower_left_names_what_arrived(hub, towers):
    s = stream(hub, model="solo-model", prompt=PROMPT, max_tokens=200)
    with pytest.raises(WireError) as e:
        run_killing(towers, s, lambda p: len(p) == 10, {})
    assert towers["fo-a"].proc.poll() is not None, "fo-a, the only holder, was killed"
    assert e.value.code == Code.UNREACHABLE
    assert f"stopped after {len(s.ids)} tokens ({len(s.text)} characters)" in e.value.message and s.ids
    assert "no other tower with 'solo-model'" in e.value.message
