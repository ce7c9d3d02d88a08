"""A busy grid waits instead of refusing, on towers whose model has one slot.

Eight requests at once through the gateway, a line of four: the three that
find the line full are told "busy"; the gateway's Grid waits for the earliest
of the tower's retry hint (the time until a place in its line opens) and the
tower announcing a free slot, then asks again within its deadline. None is
refused, and the slot never idles while they wait: the whole run takes the
sum of the eight generation times (the tower's own figures: time to the first
token plus the tokens over its tokens/s), within 10 %. That tower announces
no more often than a default tower (every 5 s at most), so the hint has to be
right. And a free-slot announce wakes a waiting request long before a hint
that overestimates."""

import logging
import re
import threading
import time

import openai

from tests.gateway_support import serve

MODEL = "busy-one"  # only this module's towers have these aliases
WOKEN_MODEL = "busy-woken"
TOKENS = 96


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
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join(240)
        total_s = time.perf_counter() - started
    assert not errors and len(replies) == 8, errors
    told_busy = busy_waits(caplog)
    generation_s = [r.model_extra["rngrid"]["tower_ttft_s"] + r.usage.completion_tokens /
                    r.model_extra["rngrid"]["tokens_per_s"] for r in replies.values()]
    print(f"8 requests of {TOKENS} tokens on one slot: {total_s:.2f} s in all, generation {sum(generation_s):.2f} s "
          f"(ratio {total_s / sum(generation_s):.3f}); {len(told_busy)} busy waits, hints {told_busy} s; "
          f"tokens {[r.usage.completion_tokens for r in replies.values()]}")
    assert all(r.usage.completion_tokens == TOKENS for r in replies.values())
    assert total_s <= 1.10 * sum(generation_s), (total_s, generation_s)
    assert told_busy, "no request was told busy: the test did not fill the line"
    # A hint says when a place in the line opens: within one generation, never the whole line's time.
    assert max(told_busy) <= 1.5 * max(generation_s), (told_busy, generation_s)


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
        started = time.perf_counter()
        reply = client.completions.create(model=WOKEN_MODEL, prompt="Numbers: 7, 8, 9,", max_tokens=4, temperature=0)
        waited_s = time.perf_counter() - started
        list(running)
    [hint_s] = busy_waits(caplog)
    print(f"told busy with a {hint_s:.1f} s hint; answered after {waited_s:.2f} s")
    assert reply.usage.completion_tokens == 4
    assert hint_s >= 3.0 and waited_s < hint_s - 1.5, (hint_s, waited_s)
