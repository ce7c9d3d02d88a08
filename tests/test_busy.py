"""A busy grid waits instead of refusing: eight requests at once through the
gateway on a tower whose model has one slot (and a line of four). The three
that find the line full are told "busy"; the gateway's Grid waits for the
earliest of the tower's retry hint (the time until a place in its line opens)
and the tower announcing a free slot, then asks again within its deadline.
None is refused, and the slot never idles while they wait: the whole run
takes the sum of the eight generation times, within 10 %."""

import logging
import threading
import time

import openai

from tests.gateway_support import serve

MODEL = "busy-one"  # only this module's tower has this alias
TOKENS = 96


def test_eight_requests_on_a_one_slot_tower_all_run_back_to_back(hub, model_path, caplog):
    tower = hub.start_tower("busy-a", models={MODEL: {"path": model_path, "parallel": 1}})
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
    told_busy = [r for r in caplog.records if "is busy" in r.getMessage()]
    generation_s = [r.model_extra["rngrid"]["tower_ttft_s"] + r.usage.completion_tokens /
                    r.model_extra["rngrid"]["tokens_per_s"] for r in replies.values()]
    print(f"8 requests of {TOKENS} tokens on one slot: {total_s:.2f} s in all, generation {sum(generation_s):.2f} s "
          f"(ratio {total_s / sum(generation_s):.3f}); {len(told_busy)} busy waits; "
          f"tokens {[r.usage.completion_tokens for r in replies.values()]}")
    assert told_busy, "no request was told busy: the test did not fill the line"
    assert all(r.usage.completion_tokens == TOKENS for r in replies.values())
    assert total_s <= 1.10 * sum(generation_s), (total_s, generation_s)
