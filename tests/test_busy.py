"""A busy grid waits instead of refusing, on towers whose model has one slot.

Eight requests at once through the gateway, a line of four: the three that
find the line full are told "busy"; the gateway's Grid waits for the earliest
of the tower's retry hint (the time until a place in its line opens) and the
tower announcing a free slot, then asks again within its deadline. None is
refused, and the slot never idles while they wait: by the tower's own record,
each turn's request was in line before the turn ahead of it ended. That tower announces
no more often than a default tower (every 5 s at most), so the hint has to be
right. And a free-slot announce wakes a waiting request long before a hint
that overestimates."""

import logging
import re
import threading

import openai

from tests.gateway_support import serve

MODEL = "busy-one"  # only this module's towers have these aliases
WOKEN_MODEL = "busy-woken"
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
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)

        def ask(k):
            # Counting on from a different number each: none stops early, none shares a prompt cache.
            return client.completions.create(model=MODEL, max_tokens=TOKENS, temperature=0,
                                             prompt=f"Numbers: {k * 100}, {k * 100 + 1}, {k * 100 + 2},")

        ask(7)  # warm: the runner is loaded and the tower has timed one generation (its hint)
        replies, errors = {}, []

        def run(k):
            try:
                replies[k] = ask(k)
            except Exception as e:  # counted below: a refusal is a failure
                errors.append(e)

        threads = [threading.Thread(target=run, args=(k,)) for k in range(11, 19)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(240)
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


def turns_of(tower):
    """(admitted, turn start, turn end) of each stream the tower ended normally (its log, wall-clock s)."""
    return [tuple(map(float, m)) for m in TURN.findall(tower.log())]


def test_a_free_slot_announce_wakes_a_waiting_request(hub, model_path, caplog):
    """One slot, no line: a request that comes while a short stream runs is told
    busy with the tower's hint (its first guess of a generation's time, 5 s,
    far longer than that stream); the tower announces when the slot frees
    (floor 1 s), and the request runs then instead of after the hint."""
    tower = hub.start_tower("busy-b", models={WOKEN_MODEL: {"path": model_path, "parallel": 1}},
                            limits={"queue_depth": 0})
    hub.wait_tower(tower.name)
    caplog.set_level(logging.INFO, logger="rngrid.client")
    with serve(hub) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
        running = iter(hub.grid.execute("ai/inference", {"model": WOKEN_MODEL, "prompt": "Numbers: 1, 2, 3,",
                                                         "max_tokens": 8, "temperature": 0.0}))
        next(running)  # the slot is taken
        reply = client.completions.create(model=WOKEN_MODEL, prompt="Numbers: 7, 8, 9,", max_tokens=4, temperature=0)
        list(running)
    [hint_s] = busy_waits(caplog)
    woken = [r.getMessage() for r in caplog.records if "announced a free slot: asking again now" in r.getMessage()]
    print(f"told busy with a {hint_s:.1f} s hint; {woken}")
    assert reply.usage.completion_tokens == 4
    assert hint_s >= 3.0, hint_s  # the tower's first guess: far longer than the 8-token stream
    assert woken == [f"a tower with {WOKEN_MODEL} announced a free slot: asking again now"], woken
