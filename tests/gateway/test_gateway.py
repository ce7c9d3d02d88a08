"""`rngrid serve`: the OpenAI-compatible gateway, driven by the real `openai`
package and raw HTTP, in front of a real tower process and the real model."""

import json
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from links.wire import Code, WireError
from reticulum_grid.client import Usage
from reticulum_grid.gateway.openai_reply import Reply
from reticulum_grid.gateway.openai_routes import OpenAIRoutes
from reticulum_grid.gateway.server import BindRefused, check_bind
from reticulum_grid.node.allowlist import allow, revoke
from tests.gateway_support import (laptop, openai_client, serve, serve_process, start_tower, stops, wait_idle,
                                   wait_stopped, wait_streaming)

MODEL = "gw-smol"  # only this module's tower has this alias
N_CTX = 512
COUNT = "Count from 1 to 500, separated by commas: 1, 2, 3,"
CHAT = [{"role": "user", "content": "Name two planets."}]
GATEWAY_BUSY_WAIT_S = 0  # how long the `gateway` fixture (tests/conftest.py) waits out a busy grid


@pytest.fixture(scope="module")
def tower(hub):
    # One slot and queue_depth 0: a second request while one runs is "busy"; a
    # small context window makes "until the context ends" short.
    tower = start_tower(hub, "gw-a", MODEL, n_ctx=N_CTX, settings={"parallel": 1}, limits={"queue_depth": 0})
    yield tower
    hub.stop_towers([tower])


@pytest.fixture
def client(gateway):
    return openai_client(gateway, timeout=60)


def grid_text(hub, **payload):
    pieces = list(hub.grid.execute("ai/inference", {"model": MODEL, **payload}))
    assert isinstance(pieces[-1], Usage)
    return "".join(pieces[:-1]), pieces[-1]


def test_chat_matches_the_grid(hub, client):
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=0)
    text, usage = grid_text(hub, messages=CHAT, max_tokens=24, temperature=0.0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == text
    assert choice.finish_reason == usage.finish_reason and reply.model == MODEL
    assert reply.usage.completion_tokens == usage.completion_tokens
    assert reply.usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert reply.model_extra["rngrid"]["tower"] == "gw-a"


@pytest.mark.parametrize("include_usage", [True, False])
def test_chat_stream(client, include_usage):
    whole = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=0)
    extra = {"stream_options": {"include_usage": True}} if include_usage else {}
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=0,
                                                 stream=True, **extra))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[-1].choices[0].finish_reason == "length"
    assert len({c.id for c in chunks}) == 1
    if include_usage:
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
        assert len(chunks) == len(with_choices) + 1
    else:
        assert len(chunks) == len(with_choices) and all(c.usage is None for c in chunks)


@pytest.mark.parametrize("stop, tail", [(" 6,", "5,"), ([" 9,", " 7,"], "6,")])
def test_completion_stop_string_and_list(hub, client, stop, tail):
    reply = client.completions.create(model=MODEL, prompt=COUNT, max_tokens=40, temperature=0, stop=stop)
    assert reply.choices[0].finish_reason == "stop" and reply.choices[0].text.endswith(tail), reply.choices[0].text
    streamed = client.completions.create(model=MODEL, prompt=COUNT, max_tokens=40, temperature=0, stop=stop,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == reply.choices[0].text


@pytest.mark.parametrize("stop", [None, []])
def test_no_stop(client, stop):
    reply = client.completions.create(model=MODEL, prompt=COUNT, max_tokens=12, temperature=0, stop=stop)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 12


def test_max_tokens_null_runs_until_the_context_ends(client):
    reply = client.completions.create(model=MODEL, prompt=COUNT, max_tokens=None, temperature=0)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens + reply.usage.completion_tokens == N_CTX


def test_max_completion_tokens(client):
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=5, temperature=0)
    assert reply.usage.completion_tokens == 5 and reply.choices[0].finish_reason == "length"


@pytest.mark.parametrize("field, value", [
    ("n", 2), ("audio", {"voice": "alloy", "format": "wav"}), ("logit_bias", {"42": 10}),
    ("messages", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]),
    ("bogus_field", 1), ("temperature", 7),
])
def test_what_the_grid_cannot_do_is_a_400_naming_the_field(client, field, value):
    request = {"model": MODEL, "messages": CHAT, "max_tokens": 4}
    if field == "bogus_field":  # the SDK refuses unknown arguments itself: send it as extra JSON
        request["extra_body"] = {field: value}
    else:
        request[field] = value
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**request)
    assert refused.value.status_code == 400
    assert refused.value.body["param"].startswith(field), refused.value.body


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=CHAT)
    assert missing.value.body["code"] == "model_not_found" and MODEL in missing.value.body["message"]


def test_context_too_long_is_400(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt="word " * (2 * N_CTX), max_tokens=4)
    assert refused.value.body["code"] == Code.CONTEXT_LENGTH_EXCEEDED


def test_stranger_identity_is_403(hub, tower, client):
    revoke(tower.config_path, hub.grid.identity_hash)  # the tower re-reads its allow-list at once
    try:
        with pytest.raises(openai.PermissionDeniedError) as denied:
            client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
        assert denied.value.body["code"] == Code.NOT_ALLOWED and "rngrid allow" in denied.value.body["message"]
    finally:
        allow(tower.config_path, hub.grid.identity_hash, ["infer"])
    assert client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2).usage.completion_tokens == 2


def test_busy_is_429_with_retry_after(hub, tower, client):
    stream = hub.grid.execute("ai/inference", {"model": MODEL, "prompt": COUNT, "max_tokens": 400, "temperature": 0.0})
    pieces = iter(stream)
    next(pieces)
    try:
        with pytest.raises(openai.RateLimitError) as busy:
            client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, stream=True)
        assert int(busy.value.response.headers["retry-after"]) >= 1
        assert busy.value.body["code"] == Code.BUSY and busy.value.body["retry_after"] > 0
    finally:
        pieces.close()
    assert wait_idle(hub, tower)


def _raw_request(gateway, body):
    host, port = gateway.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (f"{host}:{port}".encode(), len(data), data))
    return sock


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_stops_the_tower(hub, tower, gateway, stream):
    """Proved by the tower's own record: it stopped the stream for its client
    after a few tokens, not at the end of the window, and its slot is free."""
    # At temperature 0 this prompt runs until the context window is full (seconds).
    body = {"model": MODEL, "prompt": COUNT, "max_tokens": None, "temperature": 0, "stream": stream}
    before = len(stops(tower))
    sock = _raw_request(gateway, body)
    try:
        if stream:
            received = b""
            while b'"text": "' not in received:
                chunk = sock.recv(4096)
                assert chunk, "the gateway closed the stream"
                received += chunk
            assert received.startswith(b"HTTP/1.1 200") and b"text/event-stream" in received
        assert wait_streaming(hub, tower), "the tower never started generating"
        if not stream:  # let the tower get past prompt processing, which llama.cpp does not interrupt
            time.sleep(0.5)
    finally:
        sock.close()
    stopped = wait_stopped(tower, before)
    print(f"stream={stream}: the tower stopped the stream after {stopped} token(s)")
    assert len(stopped) == 1 and stopped[0] < N_CTX // 2, stopped  # the whole window is ~490 tokens
    assert wait_idle(hub, tower)


def test_an_error_mid_stream_is_one_sse_error_event_then_the_end():
    """The SSE writer alone, with a named test double for the Grid's events."""
    import asyncio

    async def events_double():
        yield "late "
        raise WireError(Code.UNREACHABLE, "tower gone after 1 token")

    async def collect():
        events = events_double()
        first = await anext(events)
        return [e async for e in OpenAIRoutes(None)._chunks(Reply(True, MODEL), first, events, True)]

    out = asyncio.run(collect())
    assert json.loads(out[1]["data"])["choices"][0]["delta"]["content"] == "late "
    assert out[-1]["event"] == "error" and json.loads(out[-1]["data"])["error"]["code"] == Code.UNREACHABLE
    assert not any(e.get("data") == "[DONE]" for e in out)


def sse_events(reply, on_event, timeout=120):
    """Server-sent events of a streamed reply as {"event", "data"} maps, ``on_event``
    called with each as it comes (bounded by ``timeout`` seconds)."""
    events, fields, deadline = [], {}, time.monotonic() + timeout
    for line in reply.iter_lines():
        assert time.monotonic() < deadline, f"the stream went on for {timeout} s"
        if not line:
            if fields:
                events.append(fields)
                on_event(fields)
            fields = {}
            continue
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return events + ([fields] if fields else [])


def test_a_tower_killed_mid_stream_is_one_sse_error_event_then_the_end(hub):
    """The same on the real path: the only tower with the model (its own alias) is
    killed while the gateway streams its answer: the text so far, one error event
    saying what happened, and no [DONE]."""
    alone = start_tower(hub, "gw-gone", "gw-gone-smol")
    body = {"model": "gw-gone-smol", "prompt": COUNT, "max_tokens": 400, "temperature": 0, "stream": True}
    texts = []

    def kill_after_text(event):
        data = event.get("data", "")
        if data.startswith("{") and json.loads(data).get("choices") and json.loads(data)["choices"][0]["text"]:
            texts.append(json.loads(data)["choices"][0]["text"])
            if len(texts) == 3:
                alone.kill()

    with serve(hub, busy_wait_s=0) as url:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as reply:
            assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
            events = sse_events(reply, kill_after_text)
    assert alone.proc.poll() is not None and len(texts) >= 3, "the tower was never killed mid-stream"
    errors = [e for e in events if e.get("event") == "error"]
    assert len(errors) == 1 and events[-1] is errors[0], events[-3:]
    error = json.loads(errors[0]["data"])["error"]
    assert error["code"] == Code.UNREACHABLE and "stopped after" in error["message"], error
    assert not any(e.get("data") == "[DONE]" for e in events)


def test_models_towers_health_and_execute(gateway, tower, machine):
    models = httpx.get(gateway + "/v1/models").json()["data"]
    ours = next(m for m in models if m["id"] == MODEL)
    assert ours["object"] == "model" and ours["rngrid"]["towers"] == [{"name": "gw-a", "loaded": True}]
    towers = httpx.get(gateway + "/v1/grid/towers").json()["towers"]
    row = next(t for t in towers if t["name"] == "gw-a")
    assert row["backend"] == machine.backend and row["memory"]["total_mib"] > 0
    assert set(row["load"]) == {"streams", "queue", "jobs"}
    assert httpx.get(gateway + "/health").json()["status"] == "ok"
    with httpx.stream("POST", gateway + "/v1/grid/execute", timeout=60, json={
            "command": "ai/inference", "params": {"model": MODEL, "prompt": COUNT, "max_tokens": 8, "temperature": 0}}) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        events = [json.loads(line) for line in r.iter_lines() if line]
    assert [e["type"] for e in events] == ["token"] * (len(events) - 1) + ["usage"]
    assert events[-1]["completion_tokens"] == 8 and events[-1]["tower"] == "gw-a"
    missing = httpx.post(gateway + "/v1/grid/execute", json={"command": "ai/inference", "params": {"model": "nope"}})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == Code.UNKNOWN_MODEL


def test_api_key_is_checked_on_every_request(hub, tower):
    with serve(hub, api_key="s3cret") as url:
        assert httpx.get(url + "/v1/models").status_code == 401
        assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        keyed = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0)
        assert any(m.id == MODEL for m in keyed.models.list())
        assert httpx.get(url + "/").status_code == 200  # the page itself holds no data
    with pytest.raises(BindRefused):
        check_bind("0.0.0.0", None)
    check_bind("0.0.0.0", "key")
    check_bind("127.0.0.1", None)


def test_rngrid_serve_command(hub, tower, tmp_path):
    home = laptop(hub, tmp_path)
    refused = subprocess.run([sys.executable, "-m", "reticulum_grid", "--home", str(home), "serve", "--listen",
                              "0.0.0.0:1"], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "API key" in refused.stderr
    with serve_process(home, tower) as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60)
        deadline = time.monotonic() + 30
        while not any(m.id == MODEL for m in client.models.list()):  # the tower's announce reaches the new client
            assert time.monotonic() < deadline, "the served grid never heard the tower"
            time.sleep(0.2)
        reply = client.completions.create(model=MODEL, prompt=COUNT, max_tokens=6, temperature=0)
        assert reply.usage.completion_tokens == 6 and reply.model_extra["rngrid"]["tower"] == "gw-a"


def test_web_pages_cannot_use_the_gateway_behind_the_users_back(hub, gateway, tower):
    body = json.dumps({"command": "jobs/status", "params": {}})
    # A page elsewhere posting a "simple" cross-site request (no preflight): refused before it runs.
    forged = httpx.post(gateway + "/v1/grid/execute", content=body, headers={"Content-Type": "text/plain"})
    assert forged.status_code == 415
    evil = httpx.post(gateway + "/v1/grid/execute", content=body,
                      headers={"Content-Type": "application/json", "Origin": "http://evil.example"})
    assert evil.status_code == 403 and "--cors-origin" in evil.json()["error"]["message"]
    rebound = httpx.get(gateway + "/v1/models", headers={"Host": "evil.example:8080"})  # DNS rebinding
    assert rebound.status_code == 403
    same = httpx.get(gateway + "/v1/models", headers={"Origin": gateway})  # the dashboard's own requests
    assert same.status_code == 200
    with serve(hub, origins=["http://localhost:5173"]) as url:
        preflight = httpx.options(url + "/v1/chat/completions", headers={
            "Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type"})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "http://localhost:5173"
        allowed = httpx.get(url + "/v1/models", headers={"Origin": "http://localhost:5173"})
        assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "http://localhost:5173"
