"""Failover at its edges, on real towers killed with SIGKILL mid-stream:
chat requests, stop strings, and no tower left.

fo-a and fo-b hold the same GGUF as ``fo-model``; only fo-a has ``solo-model``.
Two edges cannot be aimed with a real kill (the end message had always
arrived by the time the last text reached the test), so there the tower's
death is a test double (``dies_after``) around the client's real stream
receiver: the tower's messages stop after a chosen one and the Link counts as
lost, while every tower, request and continuation is real. The edges: the
tower dies after the last token but before the end message, and it dies
right after a character that took several tokens (the runner sends such a
character whole, with its last token's id only; the tower gives it the ids
of its own text, inference/generation.py).
"""

import pytest
import tomlkit

from links.stream import EndEvent, StreamReceiver, TokenEvent
from links.wire import Code, WireError
from reticulum_grid.client import Usage
from reticulum_grid.inference.default_model import default_model_path
from reticulum_grid.node.localgrid import TowerProcess

EMOJI_PROMPT = "Repeat this emoji five times: 👩‍👩‍👧‍👦 👩‍👩‍👧‍👦 👩‍👩‍👧‍👦 👩‍👩‍👧‍👦"  # as in test_field_tower.py
CHAT = [{"role": "user", "content": "List twenty fruits, one per line, with a short note on each."}]
PROMPT = "Count from 1 to 500, separated by commas: 1, 2, 3,"


#: The window of "ctx-model" on both towers (tokens): small, so a stream fills it.
CTX = 96


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
    """Start a killed tower again and make it routable (a live one is left as it is)."""
    if tower.proc is not None and tower.proc.poll() is None:
        return
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
        assert f"after {s.generated} tokens ({len(s.text)} characters)" in e.value.message and s.ids
    finally:
        if killed is not None:
            revive(hub, killed)


def test_no_tower_left_names_what_arrived(hub, towers):
    s = stream(hub, model="solo-model", prompt=PROMPT, max_tokens=200)
    try:
        with pytest.raises(WireError) as e:
            run_killing(towers, s, lambda p: len(p) == 10, {})
        assert towers["fo-a"].proc.poll() is not None, "fo-a, the only holder, was killed"
        assert e.value.code == Code.UNREACHABLE
        assert f"stopped after {s.generated} tokens ({len(s.text)} characters)" in e.value.message and s.ids
        assert "no other tower with 'solo-model'" in e.value.message
    finally:
        # The tests below fail over from one fo-model tower to the other: both must be up.
        revive(hub, towers["fo-a"])


def dies_after(monkeypatch, data_events):
    """Test double of a tower that dies once it sent ``data_events`` token
    messages of the next stream (None: all of them, but not its end message).
    Returns a dict that gets ``ids``: the token ids sent before the death."""
    real, seen, cut = StreamReceiver.events, [], {}

    def events(self, idle_timeout, router=None):
        first, sent, ids = not seen, 0, []
        seen.append(self)
        for event in real(self, idle_timeout, router):
            if first and (isinstance(event, EndEvent) or sent == data_events):
                cut["ids"] = ids
                raise WireError(Code.UNREACHABLE, "test double: the tower died here")
            if isinstance(event, TokenEvent):
                sent, ids = sent + 1, ids + list(event.ids)
            yield event

    monkeypatch.setattr(StreamReceiver, "events", events)
    return cut


def served_by(hub, pieces):
    """The tower that served the end, given back its standing afterwards."""
    for entry in hub.grid.table.live():
        hub.grid.health.succeeded(entry.destination_hash)
    return pieces[-1].tower


def test_a_tower_that_dies_after_the_last_token_ends_on_the_next(hub, towers, monkeypatch):
    request = {"model": "fo-model", "prompt": PROMPT, "max_tokens": 24}
    reference = list(stream(hub, **request))
    dies_after(monkeypatch, None)
    pieces = list(stream(hub, **request))  # without the fix: bad_request (max_tokens 0)
    usage = pieces[-1]
    served_by(hub, pieces)
    assert "".join(pieces[:-1]) == "".join(reference[:-1])
    assert usage.failovers == 1 and usage.completion_tokens == 24 and usage.finish_reason == "length"
    assert usage.prompt_tokens == reference[-1].prompt_tokens, "the next tower counts the prompt alone"


def test_a_tower_that_dies_after_a_character_of_several_tokens_is_continued_exactly(hub, towers, monkeypatch):
    # The first token the model gives here begins a multibyte character: the first
    # piece is that character, whole, from several tokens.
    request = {"model": "fo-model", "prompt": EMOJI_PROMPT, "max_tokens": 8}
    reference = list(stream(hub, **request))
    cut = dies_after(monkeypatch, 1)
    pieces = list(stream(hub, **request))
    served_by(hub, pieces)
    assert pieces[-1].failovers == 1 and len(cut["ids"]) > 1, "the tower must die after a several-token piece"
    assert "".join(pieces[:-1]) == "".join(reference[:-1]), "the next tower continues from the very same bytes"
    assert pieces[-1].completion_tokens == reference[-1].completion_tokens == 8


def small_window_tower(hub, name):
    """A tower serving the bundled model as "ctx-model" with a CTX-token window."""
    tower = TowerProcess(hub.root, name, {"ctx-model": default_model_path()},
                         allow={hub.grid.identity_hash: ["infer"]}, connect=[hub.address])
    doc = tomlkit.parse(tower.config_path.read_text())
    doc["models"]["ctx-model"]["n_ctx"] = CTX
    tower.config_path.write_text(tomlkit.dumps(doc))
    hub.towers.append(tower)
    tower.start()
    hub.wait_tower(name)
    return tower


def test_a_tower_that_dies_when_the_context_is_full_ends_on_the_next(hub, monkeypatch):
    # The first tower stops when prompt + output fill the window; the next one gets
    # exactly that many tokens back, which must not count as too long.
    made = [small_window_tower(hub, name) for name in ("fo-ctx-a", "fo-ctx-b")]
    request = {"model": "ctx-model", "prompt": PROMPT, "max_tokens": 500}
    reference = list(stream(hub, **request))
    assert reference[-1].prompt_tokens + reference[-1].completion_tokens == CTX
    dies_after(monkeypatch, None)
    pieces = list(stream(hub, **request))
    served_by(hub, pieces)
    assert "".join(pieces[:-1]) == "".join(reference[:-1])
    assert pieces[-1].failovers == 1 and pieces[-1].completion_tokens == reference[-1].completion_tokens
    assert pieces[-1].finish_reason == "length"
    for tower in made:
        tower.stop()
