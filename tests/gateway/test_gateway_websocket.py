"""/v1/grid/ws with a real client (the `websockets` package) against a real
gateway and tower: several commands on one socket, cancel on the tower, the
key and Origin checked before any command, malformed messages answered while
the rest goes on."""

import json
import re
import shutil
import socket
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from reticulum_grid.client import Usage
from tests.gateway_support import node_test, serve, start_tower, stops, turns, wait_stopped
from testbed.requirements import need

ROOT = Path(__file__).resolve().parents[2]
MODEL = "ws-model"
KEY = "ws-test-key"
#: A line of the tower's log for every stream it ran or stopped (tower/streams.py).
STREAMS = re.compile(r"stream \d+: (\d+ token|stopped)")
COUNT = "Count from 1 to 500, separated by commas: 1, 2, 3,"


@pytest.fixture(scope="module")
def tower(hub):
    # Two slots: two streams of one socket run side by side.
    tower = start_tower(hub, "ws-tower", MODEL, settings={"parallel": 2})
    yield tower
    hub.stop_towers([tower])


@pytest.fixture(scope="module")
def gateway(hub, tower):
    with serve(hub) as url:
        yield url.replace("http://", "ws://") + "/v1/grid/ws"


@pytest.fixture(scope="module")
def keyed(hub, tower):
    with serve(hub, api_key=KEY) as url:
        yield url.replace("http://", "ws://") + "/v1/grid/ws"


def infer(command_id, max_tokens, **params):
    return json.dumps({"id": command_id, "command": "ai/inference",
                       "params": {"model": MODEL, "prompt": COUNT, "max_tokens": max_tokens, "temperature": 0.0,
                                  **params}})


def until_done(ws, ids):
    """{id: [events]} until every id in ``ids`` sent its done event."""
    events, left = {i: [] for i in ids}, set(ids)
    while left:
        event = json.loads(ws.recv(timeout=120))
        events.setdefault(event["id"], []).append(event)
        if event["type"] == "done":
            left.discard(event["id"])
    return events


def text_of(events):
    return "".join(e["text"] for e in events if e["type"] == "token")


def grid_text(hub, max_tokens):
    pieces = list(hub.grid.execute("ai/inference", {"model": MODEL, "prompt": COUNT, "max_tokens": max_tokens,
                                                    "temperature": 0.0}))
    assert isinstance(pieces[-1], Usage)
    return "".join(pieces[:-1])


def test_two_streams_at_once_on_one_socket(tower, gateway):
    with connect(gateway) as ws:
        ws.send(infer("a", 24))
        ws.send(infer(7, 12))
        events = until_done(ws, ["a", 7])
    # The tower's record: the two streams' turns overlapped (they ran at once, not in a line).
    (_, start_1, end_1), (_, start_2, end_2) = turns(tower)[-2:]
    assert start_2 < end_1 and start_1 < end_2, turns(tower)
    # Side by side in one batch, llama.cpp's sums may round a near tie the other way than
    # a lone run: each stream's own count and text are checked, not the exact words.
    for command_id, n in (("a", 24), (7, 12)):
        usage = next(e for e in events[command_id] if e["type"] == "usage")
        assert usage["completion_tokens"] == n and usage["tower"] == "ws-tower" and text_of(events[command_id])
    assert events["a"][-1] == {"id": "a", "type": "done", "cancelled": False}


def test_a_cancel_stops_the_stream_on_the_tower(hub, tower, gateway):
    before = len(stops(tower))
    with connect(gateway) as ws:
        ws.send(infer("long", 400))
        ws.send(infer("short", 8))
        first = json.loads(ws.recv(timeout=120))
        while not (first["id"] == "long" and first["type"] == "token"):
            first = json.loads(ws.recv(timeout=120))
        ws.send(json.dumps({"id": "long", "type": "cancel"}))
        events = until_done(ws, ["long", "short"])
    assert events["long"][-1] == {"id": "long", "type": "done", "cancelled": True}
    assert not any(e["type"] in ("usage", "error") for e in events["long"]), events["long"][-3:]
    # The tower's own record: it stopped that stream for its client, long before its 400 tokens.
    stopped = wait_stopped(tower, before)
    assert stopped and stopped[0] < 400, tower.log()[-2000:]
    usage = next(e for e in events["short"] if e["type"] == "usage")
    assert usage["completion_tokens"] == 8 and events["short"][-1]["cancelled"] is False, "the other command went on"


def test_malformed_messages_get_an_error_and_the_socket_goes_on(hub, gateway):
    with connect(gateway) as ws:
        ws.send(infer("ok", 16))
        for bad, command_id in [("{not json", None), ("[1, 2]", None), (json.dumps({"command": "ai/inference"}), None),
                                (json.dumps({"id": "x", "command": 5}), "x"),
                                (json.dumps({"id": "y", "command": "no/such"}), "y"),
                                (json.dumps({"id": "z", "type": "cancel"}), "z"),
                                (json.dumps({"id": "m", "command": "ai/inference", "params": {"model": "nope"}}), "m")]:
            ws.send(bad)
        events = until_done(ws, ["ok", "x", "y", "m"])
        errors = [e for batch in events.values() for e in batch if e["type"] == "error"]
    assert sorted(str(e["id"]) for e in errors) == sorted(["None", "None", "None", "x", "y", "z", "m"]), errors
    assert {e["code"] for e in errors if e["id"] != "m"} == {"bad_request"}
    assert next(e for e in errors if e["id"] == "m")["code"] == "unknown_model"
    assert text_of(events["ok"]) == grid_text(hub, 16)


def test_a_wrong_key_is_refused_before_any_command(tower, keyed):
    with pytest.raises(InvalidStatus) as refused:
        connect(keyed, additional_headers={"Authorization": "Bearer wrong"})
    assert refused.value.response.status_code == 403
    # Without a header, the first message must be the key: a command first closes the socket.
    before = len(STREAMS.findall(tower.log()))
    with connect(keyed) as ws:
        ws.send(infer("sneak", 8))
        reply = json.loads(ws.recv(timeout=30))
        assert reply["type"] == "error" and reply["code"] == "invalid_api_key"
        with pytest.raises(Exception):
            ws.recv(timeout=30)
    assert ws.close_code == 1008
    assert len(STREAMS.findall(tower.log())) == before, "no command reached the tower"


def test_the_right_key_runs_commands(hub, keyed):
    with connect(keyed, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        ws.send(infer(1, 8))
        assert text_of(until_done(ws, [1])[1]) == grid_text(hub, 8)
    with connect(keyed) as ws:
        ws.send(json.dumps({"type": "auth", "api_key": KEY}))
        ws.send(infer(2, 8))
        assert text_of(until_done(ws, [2])[2]) == grid_text(hub, 8)


def test_a_foreign_origin_or_host_is_refused(gateway):
    with pytest.raises(InvalidStatus) as refused:
        connect(gateway, origin="http://evil.example")
    assert refused.value.response.status_code == 403
    # A DNS-rebinding page: the socket reaches 127.0.0.1, the handshake names its own host.
    port = urlsplit(gateway).port
    with pytest.raises(InvalidStatus) as rebinding:
        connect(f"ws://evil.example:{port}/v1/grid/ws", sock=socket.create_connection(("127.0.0.1", port)))
    assert rebinding.value.response.status_code == 403


def test_the_javascript_client_runs_commands_over_one_socket(hub, tower, keyed):
    need("node", "the JavaScript client runs under Node.js")
    node = shutil.which("node")
    # Node.js 22 has a global WebSocket; 20 has it behind a flag.
    flags = [] if subprocess.run([node, "-e", "process.exit(typeof WebSocket === 'undefined' ? 1 : 0)"]).returncode == 0 \
        else ["--experimental-websocket"]
    before = len(stops(tower))
    run = node_test("socket.test.mjs", flags, RNGRID_URL=keyed.replace("ws://", "http://").removesuffix("/v1/grid/ws"),
                    RNGRID_API_KEY=KEY, RNGRID_MODEL=MODEL, RNGRID_TOWER=tower.name)
    assert run.returncode == 0 and "# pass 3" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]
    assert "CANCELLED" in run.stdout
    stopped = wait_stopped(tower, before)
    assert stopped and stopped[0] < 2000, "the cancel reached the tower"
