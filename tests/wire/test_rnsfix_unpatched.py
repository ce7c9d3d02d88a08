"""Each fix in links/rnsfix.py is needed: its test, which passes in
test_rnsfix.py (and test_announce.py), fails here on RNS 0.9.4 without it.

Each group of tests runs once more in a fresh pytest process with
RNGRID_RNS_UNPATCHED naming the fixes to leave out, so that process, its
echo server, transport node and towers all start RNS without them (and with
every other fix, so one missing fix cannot hide behind another). Every one of
those tests bounds its own waits, so an unpatched stall shows up as a failure
within seconds, never as a hang.

How reliably each is provoked, measured on 2 cores: races 1, 3 and 4 need the
sending thread to pause right after the packet leaves, which those tests do
on purpose (without the pause race 1 was not lost once in 600 round trips on
loopback); race 2 is lost within the first few Resources; the unlocked ring
walk breaks within a fraction of a second of its 3 s loop (a fixed 20,000
rounds once missed it); the others are deterministic. Race 2 once went unlost in a CI run, so it is
listed in UNRELIABLE. A test listed in UNRELIABLE is still run and reported, and
its unpatched pass is not held against the fix. A test counts as failing
without its fix only when it failed in its own body with the symptom its fix
is for (an assertion message listed below); an error in set-up or any other
failure does not count.
"""

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from links.rnsfix import FIXES, UNPATCHED_ENV

ROOT = Path(__file__).resolve().parents[2]
RNSFIX = "tests/wire/test_rnsfix.py::"
#: The fixes a group of tests runs without -> {test node id: (what goes wrong without them,
#: a pattern of the failure message that shows exactly that)}. The longest run first: the
#: runs go PARALLEL_RUNS at a time.
GROUPS = {
    "fatal_transport_jobs": {
        "tests/discovery/test_announce.py::test_app_data_limit_through_a_transport_node":
            # Its job loop may end before it forwarded the one that fits even once.
            ("one announce a transport node cannot re-send ends its job loop for good",
             r"the transport node stopped forwarding after an oversized announce|"
             r"the 317-byte announce never came through the transport node")},
    "request_reply": {
        RNSFIX + "test_many_fast_request_round_trips_lose_no_reply":
            ("race 1: replies that beat their RequestReceipt are dropped (requests time out)",
             r"\d+ of 600 replies lost")},
    "resource_advertise": {
        RNSFIX + "test_resource_responses_need_no_retry":
            # Stalled: retried after ~3 s, or (seen on a busy machine) never done within the round trip's 30 s.
            ("race 2: a part request that beats the Resource's registration stalls it ~3 s",
             r"round trip \d+: \[.*(requesting retry|retrying resource advertisement)|assert None == .*round_trip\(")},
    # One test covers both: a proof can beat the PacketReceipt (3) or its callback (4).
    "receipt_after_transmit,late_delivery_callback": {
        RNSFIX + "test_channel_messages_need_no_resend":
            ("races 3 and 4: delivery proofs that beat the PacketReceipt or its callback are lost",
             r"message \d+: \d+ resent|\d+ of \d+ messages had to be resent|delivered envelopes stuck in the ring")},
    "ring_iteration,spawned_ingress,interleaved_tcp_writes": {
        RNSFIX + "test_channel_ring_iteration_is_locked":
            ("the Channel walks its send ring without its lock", r"RuntimeError\(.*mutated during iteration"),
        RNSFIX + "test_spawned_interfaces_follow_their_servers_ingress_control":
            ("spawned TCP interfaces ignore the server's ingress_control = No",
             r"assert True is False.*should_ingress_limit"),
        RNSFIX + "test_concurrent_writes_on_one_tcp_interface_stay_whole_frames":
            ("TCP frames from several threads interleave on the wire", r"frames were interleaved on the wire")},
}
FIX_TESTS = {node: why for group in GROUPS.values() for node, (why, _) in group.items()}
SYMPTOMS = {node: symptom for group in GROUPS.values() for node, (_, symptom) in group.items()}
UNRELIABLE = {
    # Lost within the first few Resources in every local run, yet one CI run (two test workers
    # sharing 2 cores) got all its Resources through without the fix.
    RNSFIX + "test_resource_responses_need_no_retry": "race 2 is usually lost within a few Resources, not always",
}
#: Bound on each unpatched run (its tests bound their own waits far below it).
RUN_TIMEOUT_S = 120
#: Unpatched runs at once: they mostly wait out RNS timeouts (46 s one after another on 2 idle cores, 23 s so).
PARALLEL_RUNS = 2


def run_unpatched(left_out, nodes, tmp):
    """{test node id: (outcome, message)} of ``nodes`` run without ``left_out``; the outcome
    is "passed", "failure" (in the test's body), "error" (in its set-up or tear-down) or
    "skipped", the message what the report says about it (empty for a pass)."""
    report = tmp / "junit.xml"
    env = dict(os.environ, **{UNPATCHED_ENV: left_out})
    # Its own --basetemp: pytest prunes old numbered temp dirs, which must never be ours.
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={tmp / 'run'}",
           f"--junitxml={report}", *nodes]
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert report.exists(), f"the unpatched run wrote no report:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    outcomes = {}
    for case in ET.parse(report).iter("testcase"):
        node = f"{case.get('classname').replace('.', '/')}.py::{case.get('name')}"
        found = {child.tag: child for child in case}
        kind = next((k for k in ("failure", "error", "skipped") if k in found), "passed")
        message = "" if kind == "passed" else f"{found[kind].get('message', '')}\n{found[kind].text or ''}"
        outcomes[node] = (kind, message)
    return outcomes


@pytest.fixture(scope="module")
def unpatched(tmp_path_factory):
    """Outcomes of every group's unpatched run, by test node id."""
    outcomes = {}
    runs = [(left_out, list(tests), tmp_path_factory.mktemp(f"unpatched{k}"))
            for k, (left_out, tests) in enumerate(GROUPS.items())]
    with ThreadPoolExecutor(PARALLEL_RUNS) as pool:
        for found in pool.map(lambda run: run_unpatched(*run), runs):
            outcomes.update(found)
    return outcomes


def test_groups_name_real_fixes_and_cover_them_all():
    named = {name for group in GROUPS for name in group.split(",")}
    assert named == set(FIXES)


def test_the_switch_is_off_in_this_run():
    # The fixed run (this process and every tower it starts) must never be unpatched.
    assert os.environ.get(UNPATCHED_ENV) != "1"


@pytest.mark.parametrize("switch, request_patched", [("1", False), ("resource_advertise", True),
                                                     ("request_reply", False)])
def test_the_switch_leaves_out_what_it_names(switch, request_patched):
    probe = ("import RNS; from links import rnsfix; original = RNS.Link.request; "
             "print(rnsfix.apply(), RNS.Link.request is not original)")
    env = dict(os.environ, **{UNPATCHED_ENV: switch})
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["False", str(request_patched)], out.stderr
    assert "runs without its fixes" in out.stderr


@pytest.mark.parametrize("node", list(FIX_TESTS))
def test_fails_without_its_fix(unpatched, node):
    assert node in unpatched, f"{node} did not run unpatched"
    outcome, message = unpatched[node]
    if node in UNRELIABLE and outcome == "passed":
        pytest.skip(f"unpatched run passed; {UNRELIABLE[node]}")
    assert outcome == "failure", f"{node} {outcome} without its fix ({FIX_TESTS[node]}):\n{message[-2000:]}"
    assert re.search(SYMPTOMS[node], message, re.S), \
        f"{node} failed without its fix, but not with {FIX_TESTS[node]}:\n{message[-2000:]}"
