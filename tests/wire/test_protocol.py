"""The protocol registry (links/protocol.py): every Channel message type once,
each surviving a round trip, and a protocol version on every request, so a
peer on another version gets a clear error from a real tower."""

import ast
from pathlib import Path

import pytest

from links import protocol
from links.wire import Code, WireError
from reticulum_grid.inference.default_model import DEFAULT_ALIAS
from reticulum_grid.node.connection import TowerConnection
from reticulum_grid.node.identity import load_or_create

ROOT = Path(__file__).resolve().parents[2]


def _message_classes_in_the_code():
    """{class name: file} of every class in the packages that sets MSGTYPE."""
    found = {}
    for folder in ("announce", "links", "reticulum_grid"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and any(
                        isinstance(s, ast.Assign) and any(getattr(t, "id", "") == "MSGTYPE" for t in s.targets)
                        for s in node.body):
                    found[node.name] = str(path.relative_to(ROOT))
    return found


def test_every_message_type_is_registered_once():
    registered = protocol.all_message_types()
    assert len({cls.MSGTYPE for cls in registered}) == len(registered), "two message types share a MSGTYPE"
    missing = set(_message_classes_in_the_code()) - {cls.__name__ for cls in registered}
    assert not missing, f"message types not in links/protocol.py MESSAGE_TYPES: {missing}"


def test_each_family_keeps_to_its_numbers():
    for family, classes in protocol.MESSAGE_TYPES.items():
        base = protocol.FAMILIES[family]
        assert all(base < cls.MSGTYPE <= base + 0xFF for cls in classes), family


SAMPLES = {
    "TokenChunk": dict(stream_id=3, seq=1, data="é".encode(), ids=[5, 6], extra={"n": 2}),
    "StreamEnd": dict(stream_id=3, finish_reason="stop", usage={"prompt_tokens": 4}),
    "StreamError": dict(stream_id=3, code="busy", message="try again"),
    "StreamCancel": dict(stream_id=3),
    "ChunkRequest": dict(xfer_id=1, blob_id=b"\x01" * 32, indices=[0, 2]),
    "ChunkData": dict(xfer_id=1, index=2, offset=0, data=b"abc"),
    "ChunkError": dict(xfer_id=1, index=2, code="bad_chunk", message="hash differs"),
    "ChunkCancel": dict(xfer_id=1),
    "TransferProgress": dict(xfer_id=1, done=10, total=20),
    "TransferEnd": dict(xfer_id=1, ok=True, code="", message="", report={"have": 1}),
    "JobEvent": dict(watch_id=7, event={"type": "progress", "step": 1}),
    "TunnelOpen": dict(tunnel_id=2),
    "TunnelData": dict(tunnel_id=2, data=b"\x00rpc"),
    "TunnelClose": dict(tunnel_id=2, reason="eof"),
}


@pytest.mark.parametrize("cls", protocol.all_message_types(), ids=lambda cls: cls.__name__)
def test_every_message_type_survives_a_round_trip(cls):
    sent = cls(**SAMPLES[cls.__name__])
    received = cls()
    received.unpack(sent.pack())
    assert vars(received) == vars(sent)


#: SAMPLES as they go on the wire (msgpack, in hex): bytes that change here change the protocol (raise
#: protocol.VERSION), however the message types are written.
WIRE = {
    "TokenChunk": "950301c402c3a992050681a16e02",
    "StreamEnd": "9303a473746f7081ad70726f6d70745f746f6b656e7304",
    "StreamError": "9303a462757379a974727920616761696e",
    "StreamCancel": "9103",
    "ChunkRequest": "9301c4200101010101010101010101010101010101010101010101010101010101010101920002",
    "ChunkData": "94010200c403616263",
    "ChunkError": "940102a96261645f6368756e6bac686173682064696666657273",
    "ChunkCancel": "9101",
    "TransferProgress": "93010a14",
    "TransferEnd": "9501c3a0a081a46861766501",
    "JobEvent": "920782a474797065a870726f6772657373a47374657001",
    "TunnelOpen": "9102",
    "TunnelData": "9202c40400727063",
    "TunnelClose": "9202a3656f66",
}


@pytest.mark.parametrize("cls", protocol.all_message_types(), ids=lambda cls: cls.__name__)
def test_every_message_type_keeps_its_bytes_on_the_wire(cls):
    assert cls(**SAMPLES[cls.__name__]).pack().hex() == WIRE[cls.__name__]


def test_a_request_without_the_version_or_with_another_is_refused():
    assert protocol.check(protocol.stamp({"model": "m"})) == {"model": "m"}
    for request, words in (({}, "names no protocol version"),
                           ({"v": protocol.VERSION + 1}, "upgrade rngrid on this tower"),
                           ({"v": protocol.VERSION - 1}, "upgrade rngrid on the client"),
                           ({"v": True}, "names no protocol version")):
        with pytest.raises(WireError) as e:
            protocol.check(request)
        assert e.value.code == Code.PROTOCOL_MISMATCH and words in e.value.message, e.value


class NextVersionConnection(TowerConnection):
    """Test double: a client of the next protocol version (the real connection, stamping VERSION + 1)."""

    protocol_version = protocol.VERSION + 1


@pytest.fixture(scope="module")
def tower(hub):
    t = hub.start_tower("proto-a")
    yield t
    hub.stop_towers([t])


def test_a_tower_answers_a_client_on_another_protocol_with_a_clear_error(hub, tower, tmp_path):
    entry = hub.wait_tower(tower.name)
    conn = NextVersionConnection(load_or_create(tmp_path / "identity"), entry.destination_hash, "proto-a")
    try:
        for path in ("ping", "caps/full", "ai/inference"):
            with pytest.raises(WireError) as e:
                conn.request(path, {"model": DEFAULT_ALIAS, "prompt": "hi", "stream_id": 1} if path == "ai/inference"
                             else {})
            assert e.value.code == Code.PROTOCOL_MISMATCH, (path, e.value)
            assert (f"protocol {protocol.VERSION}, the client protocol {protocol.VERSION + 1}" in e.value.message
                    and "upgrade rngrid on this tower" in e.value.message), e.value.message
    finally:
        conn.close()
    assert "refused: protocol_mismatch" in tower.log()


def test_the_grid_client_reports_the_mismatch_as_its_error(hub, tower, monkeypatch):
    entry = hub.wait_tower(tower.name)
    monkeypatch.setattr(TowerConnection, "protocol_version", protocol.VERSION - 1)  # an older client
    with pytest.raises(WireError) as e:
        list(hub.grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "prompt": "hi", "max_tokens": 2},
                              tower=entry.name))
    assert e.value.code == Code.PROTOCOL_MISMATCH and "upgrade rngrid on the client" in e.value.message, e.value
    monkeypatch.undo()
    pieces = list(hub.grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "prompt": "hi", "max_tokens": 2},
                                   tower=entry.name))
    assert pieces, "the same client on the tower's protocol is served"
