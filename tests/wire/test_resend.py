"""A command whose reply was lost (a lossy radio link drops single packets, and
RNS resends neither a request nor its reply) is sent again by the client and
answered once by the tower: one stream, one job (tower/replies.py).

The loss is made by a test double around the real RNS.Link.request: the
first request on ``path`` goes out and is served, but its reply is dropped
before the client sees it. Everything else is the real stack."""

import secrets

import pytest
import RNS

from links.stream import EndEvent, TokenEvent
from links.wire import Code, WireError
from reticulum_grid.client import Usage
from reticulum_grid.inference.default_model import DEFAULT_ALIAS
from reticulum_grid.tower.replies import ReplyCache
from testbed import SECRET_DATASET as DATA

PROMPT = {"model": DEFAULT_ALIAS, "prompt": "The three primary colours are", "max_tokens": 24, "temperature": 0.0}


@pytest.fixture
def lose_first_reply(monkeypatch):
    """Drops the reply of the first RNS request on ``path`` (a lost packet)."""
    lost = []

    def arm(path, sent=None):
        real = RNS.Link.request

        def lossy(link, request_path, data=None, response_callback=None, **kwargs):
            if request_path == path and sent is not None:
                sent.append(len(data))
            if request_path == path and not lost:
                lost.append(request_path)
                response_callback = None  # served by the tower; its reply never arrives
            return real(link, request_path, data, response_callback=response_callback, **kwargs)

        monkeypatch.setattr(RNS.Link, "request", lossy)
        return lost

    return arm


@pytest.fixture(scope="module")
def tower(hub):
    t = hub.start_tower("resend-a", roles=("infer", "train"), blobs=[(DATA, "resend-data", "dataset", True)])
    hub.wait_tower(t.name)
    yield t
    hub.stop_towers([t])


def text_of(receiver, conn):
    pieces, end = [], None
    for event in receiver.events(30.0, conn.router):
        if isinstance(event, TokenEvent):
            pieces.append(event.data)
        else:
            end = event
    return b"".join(pieces).decode("utf-8"), end


def test_a_resent_inference_request_runs_once(hub, tower, lose_first_reply):
    direct = list(hub.grid.execute("ai/inference", PROMPT, tower=tower.name))
    assert isinstance(direct[-1], Usage)
    conn = hub.grid.connection(hub.wait_tower(tower.name))
    stream_id = secrets.randbelow(1 << 30)
    receiver = conn.open_stream(stream_id)
    lost = lose_first_reply("ai/inference")
    try:
        # Without the tower's reply cache the second copy is refused (stream id in use).
        reply = conn.request("ai/inference", {**PROMPT, "stream_id": stream_id}, timeout=15.0)
        text, end = text_of(receiver, conn)
    finally:
        conn.close_stream(stream_id)
    assert lost == ["ai/inference"], "the first reply must have been dropped"
    assert reply["stream_id"] == stream_id
    assert isinstance(end, EndEvent) and end.usage["completion_tokens"] == PROMPT["max_tokens"]
    assert text == "".join(direct[:-1]), "one run: the text of a direct run, nothing doubled"
    assert "sent again" in tower.log()


def test_a_resent_train_request_makes_one_job(hub, tower, lose_first_reply):
    conn = hub.grid.connection(hub.wait_tower(tower.name))
    job = {"base": DEFAULT_ALIAS, "dataset": "resend-data", "output_alias": "resend-lora", "max_steps": 1,
           "seq_len": 32, "batch_size": 1, "submit_id": secrets.randbelow(1 << 63)}
    lost = lose_first_reply("genome/train")
    job_id = conn.request("genome/train", job, timeout=30.0)["job_id"]
    try:
        assert lost == ["genome/train"]
        jobs = [j for j in conn.request("jobs/status", {})["jobs"] if j["adapter_alias"] == "resend-lora"]
        assert [j["id"] for j in jobs] == [job_id], "the resent request must not start a second job"
    finally:
        conn.request("jobs/cancel", {"job_id": job_id})


def test_a_resent_refused_train_request_gets_the_same_refusal(hub, tower, lose_first_reply, tmp_path):
    # The first run refuses the dataset and drops it from the store; run again,
    # the second found the dataset gone and answered "internal".
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "fine"}\n{not json\n')
    lost = lose_first_reply("genome/train")
    with pytest.raises(WireError) as refused:
        hub.grid.train({"base": DEFAULT_ALIAS, "output_alias": "never", "max_steps": 1}, data_path=broken,
                       tower=tower.name)
    assert lost == ["genome/train"], "the first reply must have been dropped"
    # The first run's own refusal: the dataset's second line (the second run would have found it gone).
    assert refused.value.code == Code.BAD_REQUEST and "line 2: not JSON" in refused.value.message, refused.value
    assert "sent again" in tower.log()


def test_a_request_too_big_for_one_packet_is_sent_once(hub, tower, lose_first_reply):
    # It travels as an RNS Resource, which resends its own parts; sending it again
    # would queue a second copy of the whole prompt behind the first on a slow link.
    conn = hub.grid.connection(hub.wait_tower(tower.name))
    mdu = conn.ensure_link().mdu
    prompt = "x" * (mdu + 100)
    sent = []
    lose_first_reply("ai/inference", sent)
    with pytest.raises(WireError) as e:
        conn.request("ai/inference", {**PROMPT, "prompt": prompt, "stream_id": secrets.randbelow(1 << 30)},
                     timeout=8.0)
    assert e.value.code == Code.TIMEOUT
    assert len(sent) == 1 and sent[0] > mdu, sent


def test_reply_cache_keeps_the_newest_for_a_while():
    now = [0.0]
    cache = ReplyCache(max_replies=2, keep_s=10.0, clock=lambda: now[0])
    a, b, c = (ReplyCache.key("ai/inference", bytes([i])) for i in range(3))
    cache.put(a, b"A")
    cache.put(b, b"B")
    cache.put(c, b"C")
    assert cache.get(a) is None and cache.get(b) == b"B" and cache.get(c) == b"C"
    now[0] = 11.0
    assert cache.get(b) is None and cache.get(c) is None
    assert ReplyCache.key("genome/train", b"x") != ReplyCache.key("ai/inference", b"x")
