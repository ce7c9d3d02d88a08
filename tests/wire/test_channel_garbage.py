"""Garbage Channel messages that reach rngrid's own decoders on a real tower.

A Channel message of a type nobody registered is dropped by RNS itself; these
use the types the tower registers (stream cancel, chunk request) with
payloads that break their schema, so the message classes in links/ must
refuse them. RNS drops a message whose decoder raises before it takes a
sequence number (RNS/Channel.py ``_receive``), so the same Link keeps
working afterwards. Expected: each refusal is logged with our reason, the
tower keeps serving this Link and everyone else."""

import struct

import msgpack
import pytest
import RNS

from links import manifest
from links.chunks import ChunkRequest
from links.wire import Code, WireError
from links.stream import StreamCancel
from reticulum_grid.client import Usage
from reticulum_grid.inference.default_model import DEFAULT_ALIAS
from reticulum_grid.node.connection import TowerConnection, wait_until

GARBAGE = [
    (StreamCancel.MSGTYPE, b"\xc1\xc1\xc1", "malformed message"),
    (StreamCancel.MSGTYPE, msgpack.packb([1, 2]), "wrong shape"),
    (StreamCancel.MSGTYPE, msgpack.packb([-5]), "stream id is not an unsigned integer"),
    (ChunkRequest.MSGTYPE, msgpack.packb([1, b"\x00" * 32, list(range(2000))]), "a chunk request names"),
    (ChunkRequest.MSGTYPE, msgpack.packb([1, b"short", [0]]), "blob id"),
    (ChunkRequest.MSGTYPE, msgpack.packb({"xfer_id": 1}), "wrong shape"),
]


@pytest.fixture(scope="module")
def tower(hub):
    t = hub.start_tower("garbage-a")
    hub.wait_tower(t.name)
    yield t
    t.stop()


@pytest.fixture(scope="module")
def conn(hub, tower):
    c = TowerConnection(RNS.Identity(), hub.wait_tower(tower.name).destination_hash, "garbage-sender")
    c.ensure_link()
    yield c
    c.close()


def send_raw(link, msgtype, payload):
    # RNS's Envelope layout (RNS/Channel.py): type, sequence, length, then the payload.
    # Sequence 0 is the next one the tower expects: this Link never sent a real Channel message.
    RNS.Packet(link, struct.pack(">HHH", msgtype, 0, len(payload)) + payload, context=RNS.Packet.CHANNEL).send()


@pytest.mark.parametrize("msgtype, payload, reason", GARBAGE)
def test_garbage_is_refused_by_our_decoder_and_logged(hub, tower, conn, msgtype, payload, reason):
    before = tower.log().count(reason)
    send_raw(conn.ensure_link(), msgtype, payload)
    assert wait_until(lambda: tower.log().count(reason) > before, 10), f"the tower never logged {reason!r}"
    assert conn.request("caps/full", {})["blobs"], "the Link that sent garbage must keep working"


def test_the_tower_still_serves_everyone(hub, tower, conn):
    pieces = list(hub.grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "prompt": "Hello", "max_tokens": 3},
                                   tower=tower.name))
    assert isinstance(pieces[-1], Usage) and pieces[-1].completion_tokens > 0
    # The garbage Link's Channel lost no sequence number: a real chunk request is
    # still read and answered (refused: this identity has no sync role).
    m = manifest.build(__file__)
    with pytest.raises(WireError) as e:
        list(conn.fetch(m.blob_id, m, [0]))
    assert e.value.code == Code.NOT_ALLOWED


def test_a_sequence_gap_shows_in_the_channel_description(conn):
    """What a stalled tunnel logs (ChannelRouter.describe): a message held out of order
    while an earlier sequence is missing, then nothing held once the gap fills."""
    conn.ensure_link()
    router = conn.router
    got = []
    router.on(StreamCancel, lambda message: got.append(message.stream_id))
    expected = router.channel._next_rx_sequence

    def arrive(sequence, stream_id):  # as Link.receive hands a decrypted Channel packet over
        payload = StreamCancel(stream_id).pack()
        router.channel._receive(struct.pack(">HHH", StreamCancel.MSGTYPE, sequence, len(payload)) + payload)

    arrive(expected + 1, 2)
    assert got == [] and f"rx next {expected} held [{expected + 1}]" in router.describe(), router.describe()
    arrive(expected, 1)
    assert got == [1, 2] and f"rx next {expected + 2} held []" in router.describe(), router.describe()
