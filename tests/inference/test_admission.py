"""Admission of one model (inference/admission.py), its caps and the busy wait, as units:
what a tower announces when a slot or a place in its queue frees, the retry hint
bounded by the time left on the stream it waits for, the caps that carry free
queue places, the client's last ask at its deadline and the gateway's
Retry-After. The same on a real tower: tests/inference/test_busy.py."""

import threading
import time

import msgpack
import pytest

from announce.caps import Caps, CapsError, ModelCap, decode, encode
from announce.table import TowerTable
from links.wire import Code, WireError
from reticulum_grid.client.busy import BusyWait
from reticulum_grid.gateway.errors import ApiError
from reticulum_grid.inference.admission import MIN_HINT_S, Cancelled, ModelQueue
from reticulum_grid.node import config


class Counted:
    """on_change, counted."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1


def started(queue, budget=None):
    """A ticket that took its turn (a slot), and the exit of that turn."""
    ticket = queue.admit(budget)
    turn = queue.turn(ticket, threading.Event())
    turn.__enter__()
    return ticket, lambda: turn.__exit__(None, None, None)


def test_a_freed_queue_place_is_announced_though_no_slot_frees():
    told = Counted()
    queue = ModelQueue(queue_depth=1, slots=1, on_change=told)
    _, end_first = started(queue)
    assert told.calls == 1 and queue.free == 0 and queue.room == 1  # the last slot was taken
    second = queue.admit()
    assert told.calls == 2 and queue.room == 0  # the last queue place was taken
    with pytest.raises(WireError) as busy:
        queue.admit()
    assert busy.value.code == Code.BUSY
    end_first()  # the queued request takes the slot at once: no slot is free, a queue place is
    assert told.calls == 3 and queue.free == 0 and queue.room == 1
    with queue.turn(second, threading.Event()):
        assert queue.running == 1 and queue.waiting == 0 and told.calls == 3  # nothing changed for a client
    assert told.calls == 4 and queue.free == 1


def test_a_request_that_leaves_the_line_frees_its_place_and_says_so():
    told = Counted()
    queue = ModelQueue(queue_depth=1, slots=1, on_change=told)
    _, end_first = started(queue)
    queued = queue.admit()
    assert told.calls == 2 and queue.room == 0
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        with queue.turn(queued, cancel):
            pass
    assert told.calls == 3 and queue.room == 1 and queue.waiting == 0
    gone = queue.admit()
    queue.forget(gone)  # failed before its turn
    assert told.calls == 5 and queue.room == 1
    end_first()


def test_the_hint_is_never_longer_than_the_tokens_left_on_the_stream_it_waits_for():
    queue = ModelQueue(queue_depth=0, slots=1)
    queue.record(60.0, 10.0)  # a long generation timed before: the average alone says a minute
    ticket, end = started(queue, budget=40)
    t0 = time.monotonic()
    assert queue.retry_hint(t0) == 4.0  # 40 tokens at the model's 10 tokens/s, none generated yet
    ticket.progress(1, t0)
    ticket.progress(20, t0 + 1.0)  # its own rate: 20 tokens/s
    assert queue.retry_hint(t0 + 1.0) == pytest.approx((40 - 21) / 20, abs=0.1)
    ticket.progress(19, t0 + 2.0)  # every token of its budget: about to end
    assert queue.retry_hint(t0 + 2.0) == MIN_HINT_S
    end()


def test_a_stream_slower_than_the_model_alone_is_timed_by_its_own_rate():
    """Batched with others a stream runs slower than the model's past (alone)
    said: its own rate counts, or every waiting client asks again at once."""
    queue = ModelQueue(queue_depth=0, slots=4)
    queue.record(4.0, 100.0)
    ticket, end = started(queue, budget=32)
    t0 = time.monotonic()
    assert queue.retry_hint(t0) == MIN_HINT_S  # before its first tokens: the model's 100 tokens/s
    ticket.progress(1, t0)
    ticket.progress(10, t0 + 1.0)  # 10 tokens/s in its batch
    assert queue.retry_hint(t0 + 1.0) == pytest.approx(min(4.0 - (t0 + 1.0 - ticket.started), (32 - 11) / 10),
                                                       abs=0.15)
    end()


def test_the_hint_waits_for_the_stream_that_ends_first():
    queue = ModelQueue(queue_depth=0, slots=2, initial_request_s=30.0)
    long, end_long = started(queue, budget=1000)
    short, end_short = started(queue, budget=30)
    now = time.monotonic()
    for ticket in (long, short):
        ticket.progress(1, now)
        ticket.progress(10, now + 1.0)  # 10 tokens/s each
    assert queue.retry_hint(now + 1.0) == pytest.approx((30 - 11) / 10, abs=0.15)
    with pytest.raises(WireError) as busy:
        queue.admit()
    assert busy.value.retry_after == pytest.approx((30 - 11) / 10, abs=0.15)  # never the average's 30 s
    end_short()
    end_long()


def test_without_a_budget_or_a_rate_the_hint_is_the_generations_time_left():
    queue = ModelQueue(queue_depth=0, slots=1, initial_request_s=5.0)
    _, end = started(queue)  # an embeddings request: no tokens to count
    now = time.monotonic()
    assert queue.retry_hint(now + 2.0) == pytest.approx(3.0, abs=0.15)
    assert queue.retry_hint(now + 10.0) == MIN_HINT_S
    end()


def caps_with(*models):
    return Caps("tower-q", models=models)


def test_caps_carry_free_queue_places_and_a_change_of_them_is_material():
    models = (ModelCap("m", b"\x01\x02\x03\x04", True, 0, 2), ModelCap("n", b"\x05\x06\x07\x08", True, 1, 0))
    back = decode(encode(caps_with(*models)))
    assert [(m.free, m.queue_free, m.room) for m in back.models] == [(0, 2, 2), (1, 0, 1)]
    full = caps_with(ModelCap("m", b"\x01\x02\x03\x04", True, 0, 0))
    assert "qf" not in msgpack.unpackb(encode(full))  # nothing free in a queue: the blob as before
    assert decode(encode(full)).models[0].queue_free == 0
    assert caps_with(models[0]).materially_differs(full)  # a queue place freed: announce
    assert not caps_with(ModelCap("m", b"\x01\x02\x03\x04", True, 0, 3)).materially_differs(caps_with(models[0]))


@pytest.mark.parametrize("places, why", [([1, 2], "free queue places has 2 items"), (["x"], "not an integer"),
                                         ([-1], "outside")])
def test_a_wrong_free_queue_places_list_is_refused(places, why):
    blob = msgpack.unpackb(encode(caps_with(ModelCap("m", b"\x01\x02\x03\x04", True, 0, 2))))
    blob["qf"] = places
    with pytest.raises(CapsError, match=why):
        decode(msgpack.packb(blob))


def test_an_announce_floor_under_a_second_is_a_config_error(tmp_path):
    """rns stamps an announce with its whole second and drops one no newer than
    the last it heard: a tower announcing a freed queue place within a second
    of its last announce would go unheard."""
    path = tmp_path / "tower.toml"
    path.write_text("[announce]\nfloor_s = 0.5\n")
    with pytest.raises(config.ConfigError, match="floor_s = 0.5 must be a number of seconds >= 1"):
        config.load_tower(path)
    path.write_text("[announce]\nfloor_s = 1\n")
    assert config.load_tower(path).floor_s == 1.0


class TableOnly:
    """What BusyWait uses of a Grid: its tower table (a real, empty one)."""

    def __init__(self):
        self.table = TowerTable()


def test_a_wait_cut_by_the_deadline_asks_a_last_time_then_gives_up(caplog):
    caplog.set_level("INFO", logger="rngrid.client")
    wait = BusyWait(TableOnly(), 0.3)
    busy = WireError(Code.BUSY, "the queue is full", retry_after=39.0)  # a hint that outlasts the wait
    assert wait.wait("m", busy) is True  # the deadline came: ask once more
    assert any("asking a last time" in r.getMessage() for r in caplog.records)
    assert wait.wait("m", busy) is False  # that last ask was busy too: give up
    assert wait.waits == 1


def test_a_stopped_wait_asks_no_more():
    wait = BusyWait(TableOnly(), 30.0)
    threading.Timer(0.1, wait.stop).start()
    assert wait.wait("m", WireError(Code.BUSY, "full", retry_after=20.0)) is False


@pytest.mark.parametrize("hint, header", [(2.9, "2"), (0.5, "1"), (None, "1"), (39.0, "39")])
def test_retry_after_is_the_hint_in_whole_seconds_never_later(hint, header):
    error = ApiError.from_wire(WireError(Code.BUSY, "full", retry_after=hint))
    assert error.headers() == {"Retry-After": header}
    assert error.body()["error"].get("retry_after") == hint
