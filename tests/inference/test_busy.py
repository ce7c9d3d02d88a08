"""A busy grid waits instead of refusing, on real towers.

Eight requests at once through the gateway, a line of four: the three that
find the line full are told "busy"; the gateway's Grid waits for the earliest
of the tower's retry hint (the time until a place in its line opens) and the
tower announcing room, then asks again within its deadline. None is
refused, and the slot never idles while they wait: by the tower's own record,
each turn's request was in line before the turn ahead of it ended. That tower announces
no more often than a default tower (every 5 s at most), so the hint has to be
right. A free-slot announce, and a freed-queue-place announce (no slot frees
while a line waits), wake a waiting request long before its hint. Ten
requests on four slots and a queue of four, on a tower whose past says its
generations take twice the wait: none refused (a hint bounded by the time
left on the streams it waits for, and a last ask at the deadline). A
Retry-After is never longer than the time left on the stream it waits for.
(Units of the same: tests/inference/test_admission.py.)"""

import logging
import re
import threading

import time

import openai
import pytest

from reticulum_grid.inference.admission import MIN_HINT_S
from tests.inference.concurrently import at_once
from tests.gateway_support import live_load, openai_client, serve

MODEL = "busy-one"  # only this module's towers have these aliases
WOKEN_MODEL = "busy-woken"
FOUR_MODEL = "busy-four"
QUEUED_MODEL = "busy-queued"
HINT_MODEL = "busy-hint"
#: A generation long enough that the time it took (a tower's average) outlasts a wait the short ones fit in.
LONG = 768
#: Each of the ten streams: 4 batched on one thread take a fraction of LONG's time alone (measured: a batch of
#: four 32-token streams took 3.4 s, one stream of 384 tokens alone 3.8 s).
SHORT = 8
REFUSED = re.compile(r"^(\S+ \S+),(\d{3}) rngrid.tower INFO ai/inference refused: busy", re.M)
TOKENS = 96
TURN = re.compile(r"stream \d+: \d+ token\(s\), admitted ([0-9.]+), turn ([0-9.]+)-([0-9.]+)")


def busy_waits(caplog):
    """The pauses (seconds) the Grid announced when told busy."""
    return [float(m.group(1)) for r in caplog.records
            if (m := re.search(r"is busy .*asking again within ([0-9.]+) s", r.getMessage()))]


def test_eight_requests_on_a_one_slot_tower_all_run_back_to_back(hub, model_path, caplog):
    tower = hub.start_tower("busy-a", models={MODEL: {"path": model_path, "parallel": 1}},
                            announce={"floor_s": 5, "heartbeat_s": 600})
    hub.wait_tower(tower.name)
    caplog.set_level(logging.INFO, logger="rngrid.client")
    with serve(hub) as url:  # the gateway's own busy-wait: 30 s
        client = openai_client(url)
        # Warm: the runner is loaded and the tower has timed one generation (its hint).
        assert not completions_at_once(client, MODEL, [7], TOKENS)[1]
        replies, errors = completions_at_once(client, MODEL, range(11, 19), TOKENS)
    assert not errors and len(replies) == 8, errors
    told_busy = busy_waits(caplog)
    generation_s = [r.model_extra["rngrid"]["tower_ttft_s"] + r.usage.completion_tokens /
                    r.model_extra["rngrid"]["tokens_per_s"] for r in replies.values()]
    turns = sorted(turns_of(tower))[1:]  # the warm-up's first
    print(f"8 requests of {TOKENS} tokens on one slot: generation {sum(generation_s):.2f} s; "
          f"{len(told_busy)} busy waits, hints {told_busy} s; turns (admitted, start, end) {turns}")
    assert all(r.usage.completion_tokens == TOKENS for r in replies.values())
    assert len(turns) == 8, turns
    # Back to back, by the tower's record: each turn's request was already in line when the turn before it ended.
    idle = [(prev, nxt) for prev, nxt in zip(turns, turns[1:]) if nxt[0] > prev[2]]
    assert not idle, f"the slot idled while requests waited: {idle}"
    assert told_busy, "no request was told busy: the test did not fill the line"
    # A hint says when a place in the line opens: about one generation, never the whole line's five.
    assert max(told_busy) <= 3 * max(generation_s), (told_busy, generation_s)


def ask(model, k, max_tokens, **more):
    """An ai/inference payload counting on from ``k`` (none stops early, none shares a prompt cache)."""
    return {"model": model, "prompt": f"Numbers: {k * 100}, {k * 100 + 1}, {k * 100 + 2},", "max_tokens": max_tokens,
            "temperature": 0.0, **more}


def completions_at_once(client, model, ks, max_tokens):
    """One completion per k in ``ks`` (counting on as ask() does), all at once
    through ``client`` (an openai.OpenAI): ({k: reply}, [errors])."""
    def run(k):
        return client.completions.create(model=model, prompt=ask(model, k, max_tokens)["prompt"],
                                         max_tokens=max_tokens, temperature=0)

    replies, errors = at_once(run, [(k,) for k in ks], timeout_s=240)
    return {k: reply for (k,), reply in replies.items()}, errors


def turns_of(tower):
    """(admitted, turn start, turn end) of each stream the tower ended normally (its log, wall-clock s)."""
    return [tuple(map(float, m)) for m in TURN.findall(tower.log())]


def wait_turns(tower, count, timeout=30.0):
    """turns_of(tower) once it holds ``count`` turns (the tower logs a turn just
    after the stream's end went out; bounded wait)."""
    deadline = time.monotonic() + timeout
    while len(turns_of(tower)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return sorted(turns_of(tower))


def test_a_free_slot_announce_wakes_a_waiting_request(hub, model_path, caplog):
    """One slot, no line: a request that comes while a long stream runs is told
    busy with the tower's hint (its first guess of a generation's time, 5 s, as
    no stream ended there yet); the long stream is then cancelled, the tower
    announces the freed slot (floor 1 s), and the request runs then instead of
    after the hint."""
    tower = hub.start_tower("busy-b", models={WOKEN_MODEL: {"path": model_path, "parallel": 1}},
                            limits={"queue_depth": 0})
    hub.wait_tower(tower.name)
    caplog.set_level(logging.INFO, logger="rngrid.client")
    with serve(hub) as url:
        client = openai_client(url)
        running = iter(hub.grid.execute("ai/inference", {"model": WOKEN_MODEL, "prompt": "Numbers: 1, 2, 3,",
                                                         "max_tokens": 2000, "temperature": 0.0}))
        next(running)  # the slot is taken, for far longer than the hint
        done = {}
        asking = threading.Thread(target=lambda: done.update(reply=client.completions.create(
            model=WOKEN_MODEL, prompt="Numbers: 7, 8, 9,", max_tokens=4, temperature=0)))
        asking.start()
        told = logged(caplog, "is busy")
        running.close()  # leaving the stream cancels it on the tower: the slot frees now
        asking.join(120)
    [hint_s] = busy_waits(caplog)
    woken = [r.getMessage() for r in caplog.records if "announced a free slot: asking again now" in r.getMessage()]
    print(f"told busy with a {hint_s:.1f} s hint ({told}); {woken}")
    assert done["reply"].usage.completion_tokens == 4
    assert hint_s >= 3.0, hint_s  # the tower's first guess: far longer than the slot stayed taken
    assert woken == [f"a tower with {WOKEN_MODEL} announced a free slot: asking again now"], woken


def logged(caplog, text, timeout=60.0):
    """The client's log messages holding ``text``, once there is one (bounded wait)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [r.getMessage() for r in caplog.records if text in r.getMessage()]
        if found:
            return found
        time.sleep(0.05)
    return []


def test_ten_streams_on_four_slots_and_a_queue_of_four_none_refused(hub, model_path, caplog):
    """The field case: ten requests at once, four slots and a queue of four,
    the gateway's wait shorter than the tower's average generation (a long one
    ran before) but far longer than four short streams take. The two told busy
    are taken once a place frees: their hint is the time left on the running
    streams (their tokens left), not the average, and a wait cut by its deadline
    asks a last time. The tower announces as rarely as a radio tower (a floor
    of 60 s), so no announce helps here: the hints and the last ask must."""
    tower = hub.start_tower("busy-c", models={FOUR_MODEL: {"path": model_path, "parallel": 4}},
                            limits={"queue_depth": 4}, announce={"floor_s": 60, "heartbeat_s": 600})
    hub.wait_tower(tower.name)
    *_, warm = hub.grid.execute("ai/inference", ask(FOUR_MODEL, 7, LONG))
    assert warm.completion_tokens == LONG, "the warm-up ended early: the tower's average is not a long one"
    [(_, start, end)] = wait_turns(tower, 1)
    wait_s = 0.6 * (end - start)  # the old hint, that average, outlasted this wait: two were refused
    caplog.set_level(logging.INFO, logger="rngrid.client")
    with serve(hub, busy_wait_s=wait_s) as url:
        client = openai_client(url)
        replies, errors = completions_at_once(client, FOUR_MODEL, range(11, 21), SHORT)
    told_busy = busy_waits(caplog)
    turns = wait_turns(tower, 11)[1:]
    print(f"10 streams of {SHORT} tokens on 4 slots + queue 4, a wait of {wait_s:.2f} s: {len(errors)} refused; "
          f"{len(told_busy)} busy waits, pauses {told_busy} s; turns (admitted, start, end) {turns}")
    assert not errors and len(replies) == 10, errors
    assert all(r.usage.completion_tokens == SHORT for r in replies.values())
    assert len(turns) == 10, turns  # by the tower's record, every one ran there
    assert told_busy, "no request was told busy: the test did not fill the slots and the queue"


def test_a_freed_queue_place_wakes_a_waiting_request(hub, model_path, caplog):
    """One slot and a queue of one: A runs a long stream, B waits in the
    queue, C is told busy with a hint of A's many tokens left. B leaves the
    queue; no slot frees (A runs on), but the tower announces the freed queue
    place, and C asks again then, long before its hint (the tower's first
    guess of a generation's time, 5 s, less A's time so far; the announce
    comes within the floor, 1 s, the shortest rns hears)."""
    tower = hub.start_tower("busy-d", models={QUEUED_MODEL: {"path": model_path, "parallel": 1}},
                            limits={"queue_depth": 1}, announce={"floor_s": 1, "heartbeat_s": 600})
    hub.wait_tower(tower.name)
    caplog.set_level(logging.INFO, logger="rngrid.client")
    first = hub.grid.execute("ai/inference", ask(QUEUED_MODEL, 1, 2048))
    pieces = iter(first)
    next(pieces)  # A holds the slot
    queued = hub.grid.execute("ai/inference", ask(QUEUED_MODEL, 2, 8))
    results = {}

    def run(name, stream):
        try:
            results[name] = list(stream)[-1]
        except Exception as e:  # B's cancel; anything else fails below
            results[name] = e

    threads = [threading.Thread(target=run, args=("B", queued))]
    threads[0].start()
    deadline = time.monotonic() + 30
    while live_load(hub, tower).queue < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_load(hub, tower).queue == 1, "B never waited in the queue"
    threads.append(threading.Thread(target=run, args=("C", hub.grid.execute("ai/inference", ask(QUEUED_MODEL, 3, 4),
                                                                              busy_wait=120))))
    threads[1].start()
    try:
        assert logged(caplog, f"every tower with {QUEUED_MODEL} is busy"), "C was never told busy"
        queued.cancel()  # B leaves the queue: a place frees, no slot does
        woken = logged(caplog, f"a tower with {QUEUED_MODEL} announced", timeout=20)
    finally:
        first.cancel()  # A ends: C, in the queue by now (or given up), runs
        pieces.close()
        for t in threads:
            t.join(120)
    [hint_s] = busy_waits(caplog)
    print(f"C told busy with a {hint_s:.1f} s hint; {woken}")
    assert woken == [f"a tower with {QUEUED_MODEL} announced a free queue place: asking again now"], woken
    assert results["C"].completion_tokens == 4, results["C"]


def test_a_retry_after_follows_the_stream_it_waits_for_not_the_average(hub, model_path):
    """One slot, no queue, and a long generation timed before (the tower's
    average): a request refused while a short stream runs is told to come back
    when that stream ends, not after the average. Its Retry-After (the body's
    seconds) is under half the average generation by the tower's own log (the
    short stream is an eighth of it; the old hint was the average itself). The
    hint is the stream's remaining tokens at its rate so far, an estimate: a
    stream that speeds up ends sooner than it said (seen in CI: 0.6 s said,
    0.33 s left), so the time left is no exact bound."""
    tower = hub.start_tower("busy-e", models={HINT_MODEL: {"path": model_path, "parallel": 1}},
                            limits={"queue_depth": 0})
    hub.wait_tower(tower.name)
    *_, warm = hub.grid.execute("ai/inference", ask(HINT_MODEL, 1, LONG // 3))
    assert warm.completion_tokens == LONG // 3
    with serve(hub, busy_wait_s=0) as url:
        client = openai_client(url)
        running = iter(hub.grid.execute("ai/inference", ask(HINT_MODEL, 2, 4 * SHORT)))
        next(running)  # the short stream holds the slot
        with pytest.raises(openai.RateLimitError) as busy:
            client.completions.create(model=HINT_MODEL, prompt="Numbers: 7, 8, 9,", max_tokens=4, temperature=0)
        *_, usage = running
    assert usage.completion_tokens == 4 * SHORT
    [(_, warm_start, warm_end), (_, _, end)] = wait_turns(tower, 2)
    [(stamp, ms)] = REFUSED.findall(tower.log())
    refused_at = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000
    hint = busy.value.body["retry_after"]
    print(f"Retry-After {hint} s ({busy.value.response.headers['retry-after']} s in the header); the stream it "
          f"waited for ended {end - refused_at:.2f} s after the refusal; the average was {warm_end - warm_start:.2f} s")
    assert refused_at <= end and MIN_HINT_S <= hint < (warm_end - warm_start) / 2, hint
    assert busy.value.response.headers["retry-after"] == str(max(1, int(hint)))
