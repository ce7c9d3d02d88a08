"""JSON that no tower takes is a 400 on every route that reads JSON, never a
500 (gateway/http.py parse_json): arrays nested past the gateway's depth (and
past Python's parser, which raised RecursionError), and a lone UTF-16
surrogate (valid JSON, no UTF-8 text: packing it for the tower raised
UnicodeEncodeError). The same over the WebSocket, whose socket goes on. A list
or an object where a name belongs is a 400 naming the field too, and so is a
file sent as a text field of an upload."""

import io
import json
import wave

import httpx
import pytest
from websockets.sync.client import connect

from reticulum_grid.gateway.http import MAX_JSON_DEPTH
from tests.gateway_support import serve

ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/audio/speech",
          "/v1/grid/execute", "/api/chat", "/api/generate", "/api/show", "/api/embed", "/api/embeddings", "/api/pull"]
SURROGATE = '{"model": "m", "prompt": "\\ud800", "messages": [{"role": "user", "content": "\\udfff"}], ' \
            '"input": "\\ud800", "command": "ai/inference", "params": {"prompt": "\\ud800"}}'
BODIES = {
    "nested past the depth": '{"model": "m", "prompt": ' + "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1) + "}",
    "nested past Python's parser": "[" * 100_000 + "]" * 100_000,
    "a lone surrogate": SURROGATE,
}


#: A list or an object where the API wants a name (a role, an item's or a part's type, a model), with the
#: field the 400 names. Each was looked up in a table as it came: TypeError (unhashable), a 500.
NAMES_AS_LISTS = [
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": ["user"], "content": "hi"}]}, "messages[0].role"),
    ("/api/chat", {"model": "m", "messages": [{"role": {"user": 1}, "content": "hi"}]}, "messages[0].role"),
    ("/v1/responses", {"model": "m", "input": [{"type": ["message"], "role": "user"}]}, "input[0].type"),
    ("/v1/responses", {"model": "m", "input": [{"role": ["user"], "content": "hi"}]}, "input[0].role"),
    ("/v1/responses", {"model": "m", "input": [{"role": "user", "content": [{"type": ["input_text"], "text": "hi"}]}]},
     "input[0].content[0]"),
    ("/v1/audio/speech", {"model": ["tts-1"], "input": "hi"}, "model"),
]


@pytest.fixture(scope="module")
def gateway(hub):
    with serve(hub) as url:
        yield url


@pytest.mark.parametrize("what", BODIES)
def test_json_no_tower_takes_is_400_on_every_route(gateway, what):
    answers = {route: httpx.post(gateway + route, content=BODIES[what], timeout=60,
                                 headers={"Content-Type": "application/json"}) for route in ROUTES}
    wrong = {route: (r.status_code, r.text[:200]) for route, r in answers.items() if r.status_code != 400}
    assert not wrong, wrong
    for route, reply in answers.items():
        error = reply.json()["error"]
        message = error if isinstance(error, str) else error["message"]
        assert "nested deeper" in message or "surrogate" in message, (route, message)


def test_the_websocket_answers_an_error_event_and_goes_on(gateway):
    with connect(gateway.replace("http://", "ws://") + "/v1/grid/ws", open_timeout=30) as ws:
        for text in (SURROGATE.replace('"command"', '"id": 1, "command"'), BODIES["nested past the depth"]):
            ws.send(text)
            event = json.loads(ws.recv(timeout=30))
            assert event["type"] == "error" and event["code"] == "bad_request", event
        ws.send(json.dumps({"id": 2, "type": "cancel"}))  # still serving: a cancel of nothing is answered
        assert json.loads(ws.recv(timeout=30))["type"] == "error"


@pytest.mark.parametrize("route, body, param", NAMES_AS_LISTS)
def test_a_list_where_a_name_belongs_is_400_naming_the_field(gateway, route, body, param):
    reply = httpx.post(gateway + route, json=body, timeout=60)
    assert reply.status_code == 400, (reply.status_code, reply.text[:200])
    error = reply.json() if route.startswith("/api/") else reply.json()["error"]
    assert error["param"] == param, error


def test_a_file_sent_as_a_transcription_option_is_400(gateway):
    audio = io.BytesIO()
    with wave.open(audio, "wb") as out:  # half a second of 16 kHz silence: audio any engine reads
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16_000)
        out.writeframes(bytes(16_000))
    reply = httpx.post(gateway + "/v1/audio/transcriptions", timeout=60,
                       files={"file": ("a.wav", audio.getvalue(), "audio/wav"), "language": ("en.txt", b"en")})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "language", reply.text[:200]
