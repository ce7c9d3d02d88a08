"""``split/probe`` on real towers (split/probe.py): a tower pings only towers
it heard announce as lenders, refuses any other destination a caller names
without linking to it, and keeps no Link (nor its threads) per name asked."""

import os
import time

import psutil
import pytest

CALLS = 100


@pytest.fixture(scope="module")
def towers(hub):
    a = hub.start_tower("probe-a", models={})
    started = [a, hub.start_tower("probe-b", models={}, connect=[hub.address, a.address])]  # b announces to a
    for tower in started:
        hub.wait_tower(tower.name)
    yield started
    hub.stop_towers(started)


def probe(hub, tower, keys):
    return hub.grid.connection(hub.wait_tower(tower.name)).request("split/probe", {"towers": keys}, 30)


def test_a_heard_lender_is_measured_and_an_unknown_destination_refused(hub, towers):
    a, b = towers
    lender, stranger = hub.wait_tower(b.name).destination_hash, os.urandom(16)
    assert hub.wait_tower(b.name).caps.lend_mib, "the test towers lend memory (ggml-rpc-server is built)"
    deadline = time.monotonic() + 60
    while True:  # until a has heard b's announce, and then measured it
        reply = probe(hub, a, [lender, stranger])
        assert stranger.hex() in reply["refused"] and stranger.hex() not in reply["pending"]
        if lender.hex() in reply["rtts"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert reply["rtts"][lender.hex()] > 0 and not reply["pending"]


def test_many_probes_of_unknown_destinations_leave_the_thread_count_bounded(hub, towers):
    a, _ = towers
    process = psutil.Process(a.proc.pid)
    before = process.num_threads()
    for _ in range(CALLS):
        keys = [os.urandom(16) for _ in range(16)]
        assert sorted(probe(hub, a, keys)["refused"]) == sorted(k.hex() for k in keys)
    after = process.num_threads()
    # Before the fix each name got a Link kept open: 100 calls took a tower from 35 to 346 threads.
    assert after <= before + 4, f"{before} threads before {CALLS} probes, {after} after"
