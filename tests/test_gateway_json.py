"""JSON that no tower takes is a 400 on every route that reads JSON, never a
500 (gateway/http.py parse_json): arrays nested past the gateway's depth (and
past Python's parser, which raised RecursionError), and a lone UTF-16
surrogate (valid JSON, no UTF-8 text: packing it for the tower raised
UnicodeEncodeError). The same over the WebSocket, whose socket goes on."""

import json

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
