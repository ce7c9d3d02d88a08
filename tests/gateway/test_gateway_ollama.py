"""Ollama's API on `rngrid serve`, driven by the real `ollama` Python package
(OLLAMA_HOST pointed at the gateway) in front of a real tower process and the
real model: version, list, show, ps, chat and generate streamed and not, tools
and format, embed, pull, and the errors and cancel of the OpenAI side."""

import json
import math
import time

import httpx
import ollama
import pytest

from reticulum_grid.client import Usage
from reticulum_grid.gateway.server import BackgroundServer
from reticulum_grid.node.localgrid import free_port
from reticulum_grid.store.sync import SyncReport
from tests.gateway_support import (WEATHER, laptop, serve, serve_process, start_tower, stops, wait_idle,
                                   wait_stopped, wait_streaming)

MODEL = "gw-olla"  # only this module's tower has this alias
N_CTX = 1024
CHAT = [{"role": "user", "content": "Name two planets."}]
COUNT = "Count from 1 to 500, separated by commas: 1, 2, 3,"
GATEWAY_BUSY_WAIT_S = 30  # how long the `gateway` fixture (tests/conftest.py) waits out a busy grid


@pytest.fixture(scope="module")
def tower(hub):
    tower = start_tower(hub, "gw-ollama", MODEL, roles=("infer", "sync"), n_ctx=N_CTX, settings={"embeddings": True})
    yield tower
    hub.stop_towers([tower])


@pytest.fixture
def client(gateway, monkeypatch):
    monkeypatch.setenv("OLLAMA_HOST", gateway)  # as a user points any Ollama client at the grid
    return ollama.Client(timeout=120)


def grid_text(hub, **payload):
    pieces = list(hub.grid.execute("ai/inference", {"model": MODEL, "temperature": 0.0, **payload}))
    assert isinstance(pieces[-1], Usage)
    return "".join(pieces[:-1]), pieces[-1]


def test_version_list_show_and_ps(client, tower, machine):
    version = httpx.get(str(client._client.base_url) + "/api/version").json()["version"]
    assert [int(part) for part in version.split(".")] >= [0, 6, 4]  # what model-picker apps check for
    deadline = time.monotonic() + 60
    while True:  # a tower reads what its model is in the background after it starts
        listed = {m.model: m for m in client.list().models}
        ours = listed.get(f"{MODEL}:latest")
        if ours is not None and ours.details.family:
            break
        assert time.monotonic() < deadline, f"{MODEL} never listed with its details: {listed}"
        time.sleep(0.5)
    assert ours.size > 50_000_000 and len(ours.digest) == 64 and ours.modified_at is not None
    assert ours.details.format == "gguf" and ours.details.family == "llama"
    assert ours.details.quantization_level == "Q4_1" and ours.details.parameter_size.endswith("M")

    shown = client.show(MODEL)
    assert {"completion", "tools"} <= set(shown.capabilities)
    assert shown.modelinfo["general.architecture"] == "llama" and shown.modelinfo["llama.context_length"] == 8192
    assert shown.details.family == "llama"
    assert client.show(f"{MODEL}:latest").modelinfo == shown.modelinfo

    running = [m for m in client.ps().models if m.model == f"{MODEL}:latest"]
    assert len(running) == 1 and running[0].context_length == N_CTX and running[0].size > 50_000_000
    assert (running[0].size_vram == 0) == (machine.backend == "cpu"), running[0]  # a CPU tower has no VRAM
    raw = httpx.get(str(client._client.base_url) + "/api/ps").json()["models"]
    grid = next(m["rngrid"] for m in raw if m["model"] == f"{MODEL}:latest")
    assert grid["tower"] == tower.name and grid["slots"] >= 1 and 0 <= grid["slots_free"] <= grid["slots"]


def test_chat_streamed_and_not(hub, client):
    whole = client.chat(model=MODEL, messages=CHAT, options={"temperature": 0, "num_predict": 24})
    text, usage = grid_text(hub, messages=CHAT, max_tokens=24)
    assert whole.message.role == "assistant" and whole.message.content == text
    assert whole.done and whole.done_reason == "length" and whole.eval_count == 24
    assert whole.prompt_eval_count == usage.prompt_tokens
    assert whole.total_duration > whole.eval_duration > 0 and whole.prompt_eval_duration > 0
    raw = httpx.post(str(client._client.base_url) + "/api/chat", timeout=120, json={
        "model": MODEL, "messages": CHAT, "stream": False, "options": {"temperature": 0, "num_predict": 24}}).json()
    # llama.cpp's rate counts the tokens after the first, which comes with the prompt (links/usage.py)
    rate = (raw["eval_count"] - 1) / raw["eval_duration"] * 1e9
    assert rate == pytest.approx(raw["rngrid"]["tokens_per_s"], rel=0.01)

    parts = list(client.chat(model=f"{MODEL}:latest", messages=CHAT, options={"temperature": 0, "num_predict": 24},
                             stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].done_reason == "length"
    assert "".join(p.message.content for p in parts) == text and parts[-1].eval_count == 24
    assert len(parts) > 3  # streamed as it came, not all at once


def test_generate_streamed_not_and_raw(hub, client):
    whole = client.generate(model=MODEL, prompt="Name two planets.", options={"temperature": 0, "num_predict": 16})
    assert whole.response == grid_text(hub, messages=CHAT, max_tokens=16)[0] and whole.done_reason == "length"
    parts = list(client.generate(model=MODEL, prompt="Name two planets.", stream=True,
                                 options={"temperature": 0, "num_predict": 16}))
    assert "".join(p.response for p in parts) == whole.response and parts[-1].done
    raw = client.generate(model=MODEL, prompt=COUNT, raw=True, options={"temperature": 0, "num_predict": 40,
                                                                       "stop": [" 6,"]})
    assert raw.response == grid_text(hub, prompt=COUNT, max_tokens=40, stop=[" 6,"])[0]
    assert raw.done_reason == "stop" and raw.response.endswith("5,"), raw.response
    loaded = client.generate(model=MODEL)  # Ollama's "load the model": answered at once
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    with pytest.raises(ollama.ResponseError) as unload:  # towers unload only for another model
        client.generate(model=MODEL, keep_alive=0)
    assert unload.value.status_code == 400 and "keep_alive" in unload.value.error


def test_tools_and_format(client):
    ask = [{"role": "user", "content": "Use the get_weather tool to find the weather in Paris."}]
    reply = client.chat(model=MODEL, messages=ask, tools=WEATHER, options={"temperature": 0, "num_predict": 60})
    [call] = reply.message.tool_calls  # Ollama's shape: a whole call, its arguments an object
    assert call.function.name == "get_weather" and isinstance(call.function.arguments["city"], str)
    streamed = [p for p in client.chat(model=MODEL, messages=ask, tools=WEATHER, stream=True,
                                       options={"temperature": 0, "num_predict": 60})]
    calls = [c for p in streamed for c in (p.message.tool_calls or ())]
    assert len(calls) == 1 and calls[0].function.arguments == call.function.arguments
    history = ask + [{"role": "assistant", "content": "", "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_name": "get_weather", "content": "Sunny, 24 degrees"}]
    answer = client.chat(model=MODEL, messages=history, options={"temperature": 0, "num_predict": 24})
    assert answer.message.content and not answer.message.tool_calls

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "legs": {"type": "integer"}},
              "required": ["name", "legs"]}
    spider = client.chat(model=MODEL, messages=[{"role": "user", "content": "Describe a spider as JSON."}],
                         format=schema, options={"temperature": 0, "num_predict": 80})
    parsed = json.loads(spider.message.content)
    assert isinstance(parsed["name"], str) and isinstance(parsed["legs"], int)
    generated = client.generate(model=MODEL, prompt="Give me a JSON object with one key, the name of a cat.",
                                format="json", options={"temperature": 0, "num_predict": 120})
    assert generated.done_reason == "stop" and isinstance(json.loads(generated.response), dict)


def test_embed_and_embeddings(client):
    texts = ["The sea is salty.", "The sea is salty.", "Tax forms are due in April."]
    got = client.embed(model=MODEL, input=texts)
    assert len(got.embeddings) == 3 and len(got.embeddings[0]) == 576 and got.prompt_eval_count > 0

    def cosine(a, b):
        return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))

    assert cosine(got.embeddings[0], got.embeddings[1]) == pytest.approx(1.0, abs=1e-6)
    assert cosine(got.embeddings[0], got.embeddings[2]) < 0.999
    legacy = client.embeddings(model=MODEL, prompt="The sea is salty.")
    assert legacy.embedding == pytest.approx(got.embeddings[0], abs=1e-6)
    short = client.embed(model=MODEL, input="The sea is salty.", dimensions=32)
    assert len(short.embeddings[0]) == 32


def test_durations_add_up_on_every_reply(gateway):
    """Ollama's load, prompt eval and eval durations are spans one after another
    inside the total (ns), on every kind of reply, streamed or not."""
    options = {"temperature": 0, "num_predict": 12}
    ask = [{"role": "user", "content": "Use the get_weather tool to find the weather in Paris."}]
    bodies = {"chat": {"messages": CHAT}, "generate": {"prompt": "Name two planets."},
              "chat with tools": {"messages": ask, "tools": WEATHER, "options": {"temperature": 0, "num_predict": 60}}}
    replies = {}
    for kind, body in bodies.items():
        route = "/api/generate" if kind == "generate" else "/api/chat"
        for stream in (False, True):
            reply = httpx.post(gateway + route, json={"model": MODEL, "options": options, **body, "stream": stream},
                               timeout=120)
            assert reply.status_code == 200, reply.text
            replies[f"{kind}, streamed" if stream else kind] = json.loads(reply.text.splitlines()[-1])
    for kind, last in replies.items():
        parts = [last["load_duration"], last["prompt_eval_duration"], last["eval_duration"]]
        assert last["done"] and all(isinstance(p, int) and p >= 0 for p in parts), (kind, last)
        assert sum(parts) <= last["total_duration"], (kind, last)
        assert last["prompt_eval_duration"] > 0 and last["eval_duration"] > 0 and last["eval_count"] > 1, (kind, last)
    embedded = httpx.post(gateway + "/api/embed", json={"model": MODEL, "input": ["The sea is salty."]}, timeout=120)
    assert 0 <= embedded.json()["load_duration"] <= embedded.json()["total_duration"], embedded.json()


def test_unknown_names_are_ignored_as_ollama_ignores_them(gateway):
    """Ollama drops fields it does not know (its clients send OpenAI's beside
    its own); a known field of the wrong type is still a 400 naming it."""
    extra = {"temperature": 0.2, "top_p": 0.9, "max_output_tokens": 8, "tool_choice": "auto", "user": "me"}
    chat = httpx.post(gateway + "/api/chat", timeout=120, json={
        "model": MODEL, "stream": False, "messages": [{"role": "user", "content": "Hi", "name": "me"}],
        "options": {"temperature": 0, "num_predict": 4, "not_an_option": 1}, **extra})
    assert chat.status_code == 200 and chat.json()["eval_count"] == 4, chat.text
    generated = httpx.post(gateway + "/api/generate", timeout=120, json={
        "model": MODEL, "prompt": "Hi", "stream": False, "options": {"num_predict": 4}, "echo": False, **extra})
    assert generated.status_code == 200 and generated.json()["eval_count"] == 4, generated.text
    embedded = httpx.post(gateway + "/api/embed", json={"model": MODEL, "input": "Hi", "encoding_format": "float"})
    assert embedded.status_code == 200 and len(embedded.json()["embeddings"]) == 1, embedded.text
    shown = httpx.post(gateway + "/api/show", json={"model": MODEL, "verbose": True, "extra": 1})
    assert shown.status_code == 200 and shown.json()["details"]["format"] == "gguf", shown.text
    for field, value in (("stream", "yes"), ("options", {"temperature": "hot"}), ("messages", "Hi")):
        refused = httpx.post(gateway + "/api/chat", json={"model": MODEL, "messages": CHAT, field: value})
        assert refused.status_code == 400 and field in refused.json()["error"], refused.text


def test_bodies_are_json_whatever_the_content_type_says(gateway):
    """As Ollama reads them: litellm sends no Content-Type, Ollama's documented
    `curl -d` sends a form's. A form's text/plain, the one way a web page's plain
    form posts a JSON object, and a foreign Origin stay refused, in Ollama's shape."""
    body = json.dumps({"model": MODEL, "prompt": "Hi", "stream": False, "options": {"num_predict": 2}})
    for headers in ({}, {"Content-Type": "application/x-www-form-urlencoded"}):
        reply = httpx.post(gateway + "/api/generate", content=body, headers=headers, timeout=120)
        assert reply.status_code == 200 and reply.json()["eval_count"] == 2, (headers, reply.text)
    form = httpx.post(gateway + "/api/generate", content=body, headers={"Content-Type": "text/plain"})
    assert form.status_code == 415 and "application/json" in form.json()["error"], form.text
    page = httpx.post(gateway + "/api/generate", content=body, headers={"Origin": "http://evil.example"})
    assert page.status_code == 403 and "--cors-origin" in page.json()["error"], page.text
    empty = httpx.post(gateway + "/api/chat", content=b"")
    assert empty.status_code == 400 and "missing request body" in empty.json()["error"], empty.text
    openai = httpx.post(gateway + "/v1/completions", content=body)  # OpenAI's routes want JSON said, as OpenAI does
    assert openai.status_code == 415 and "application/json" in openai.json()["error"]["message"], openai.text


def test_pull_brings_the_model_into_the_gateways_store(hub, client):
    try:
        lines = list(client.pull(MODEL, stream=True))
        statuses = [line.status for line in lines]
        assert statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses
        progress = [line for line in lines if line.total]
        assert progress and progress[-1].completed == progress[-1].total > 50_000_000
        assert progress[-1].digest == "blake3:" + hub.grid.local_blob(MODEL).hex()
        assert client.pull(MODEL).status == "success"  # again: already here
    finally:  # the hub's client would otherwise count as a source of this model for later requests
        hub.grid.store.remove(MODEL)


class NoTowers:
    def live(self):
        return []


class StoreEmptiedDuringPull:
    """Test double: a Grid that has heard no tower and whose pull completes, after
    which its store no longer has the blob (``rngrid models rm`` ran in between):
    Grid.pull answers None for its BlobInfo, as the real one does then."""
    table = NoTowers()

    def pull(self, name, progress=None, **_):
        progress(1 << 20, 1 << 20)
        return None, SyncReport(bytes(32), 1 << 20, 1)


def test_a_pull_whose_blob_was_removed_meanwhile_is_an_error_in_ollamas_shape():
    with BackgroundServer(StoreEmptiedDuringPull(), port=free_port()) as url:
        whole = httpx.post(url + "/api/pull", json={"model": "big", "stream": False}, timeout=60)
        streamed = httpx.post(url + "/api/pull", json={"model": "big"}, timeout=60)
    assert whole.status_code == 404 and whole.json()["code"] == "unknown_blob", whole.text
    assert "big was fetched but is no longer in this gateway's store" in whole.json()["error"]
    lines = [json.loads(line) for line in streamed.text.splitlines()]
    assert lines[0] == {"status": "pulling manifest"} and lines[-1]["code"] == "unknown_blob", lines


def test_errors_have_ollamas_shape_and_the_grids_codes(client, gateway):
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="no-such-model", messages=CHAT)
    assert missing.value.status_code == 404 and "no-such-model" in missing.value.error
    raw = httpx.post(gateway + "/api/chat", json={"model": "no-such-model", "messages": CHAT})
    assert raw.json()["code"] == "unknown_model"  # the grid's code beside Ollama's "error"
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model=MODEL, messages=CHAT, options={"mirostat": 2})
    assert refused.value.status_code == 400 and "options.mirostat" in refused.value.error
    with pytest.raises(ollama.ResponseError) as image:
        client.chat(model=MODEL, messages=[{"role": "user", "content": "hi", "images": [b"\x89PNG"]}])
    assert image.value.status_code == 400 and "images" in image.value.error
    unknown = httpx.post(gateway + "/api/nope", json={})
    assert unknown.status_code == 404 and "/api/nope" in unknown.json()["error"]


def test_api_key_is_checked(hub, tower, monkeypatch):
    with serve(hub, api_key="s3cret") as url:
        monkeypatch.setenv("OLLAMA_HOST", url)
        with pytest.raises(ollama.ResponseError) as denied:
            ollama.Client().list()
        assert denied.value.status_code == 401
        monkeypatch.setenv("OLLAMA_API_KEY", "s3cret")  # the ollama package sends it as a Bearer token
        assert any(m.model == f"{MODEL}:latest" for m in ollama.Client().list().models)


def test_a_client_that_leaves_stops_the_tower(hub, tower, client):
    """Proved by the tower's own record: it stopped the stream for its client
    after a few tokens, not at the end of the window, and its slot is free."""
    before = len(stops(tower))
    parts = client.generate(model=MODEL, prompt=COUNT, raw=True, stream=True, options={"temperature": 0})
    for i, part in enumerate(parts):
        if i == 3:
            break
    assert wait_streaming(hub, tower), "the tower was not generating"
    parts.close()  # the ollama package's stream: closing it closes the connection
    stopped = wait_stopped(tower, before)
    assert len(stopped) == 1 and stopped[0] < N_CTX // 2, stopped  # the whole window is ~1,000 tokens
    assert wait_idle(hub, tower)


def test_rngrid_serve_in_its_own_process_speaks_ollama(hub, tower, tmp_path, monkeypatch):
    """`rngrid serve` as a user runs it (its own process, RNS and Grid), the ollama package pointed at it."""
    with serve_process(laptop(hub, tmp_path), tower) as port:
        monkeypatch.setenv("OLLAMA_HOST", f"http://127.0.0.1:{port}")
        client = ollama.Client(timeout=120)
        deadline = time.monotonic() + 60
        while not any(m.model == f"{MODEL}:latest" for m in client.list().models):  # the tower's announce arrives
            assert time.monotonic() < deadline, "the served grid never heard the tower"
            time.sleep(0.3)
        reply = client.chat(model=MODEL, messages=CHAT, options={"temperature": 0, "num_predict": 6})
        assert reply.done and reply.eval_count == 6 and reply.message.content
        assert any(m.model == f"{MODEL}:latest" for m in client.ps().models)


def test_a_stream_that_fails_after_its_first_line_ends_with_one_error_line_and_closes_the_call():
    """Ollama's clients raise on an ``{"error": ...}`` line: a failure mid-stream
    (generation or pull) comes as one, after the lines already sent, and the grid
    call behind the stream is closed."""
    import asyncio

    from links.wire import Code, WireError
    from reticulum_grid.gateway.ollama_routes import _ndjson
    closed = []

    async def call():
        try:
            yield {"status": "pulling manifest"}
            raise WireError(Code.UNREACHABLE, "the tower went away")
        finally:
            closed.append(True)

    async def lines():
        events = call()
        return [json.loads(line) async for line in _ndjson(events, events)]

    assert asyncio.run(lines()) == [{"status": "pulling manifest"},
                                    {"error": "the tower went away", "code": Code.UNREACHABLE}]
    assert closed == [True]
