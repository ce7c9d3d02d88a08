"""The suite's own rules (DESIGN's test rules), read from its source:

- a fixture that starts a tower, a transport node, a runner or a lab stops it
  when its scope ends: it yields, then stops (a fixture that returns one leaves
  it running under every later test);
- no assert bounds a wall-clock time from above unless the test is about a
  timeout of its own and its bound is ten times the expected time: such tests
  are listed in ``TIMEOUT_BOUNDS`` with what they bound. Order, cancellation
  and back-to-back work are proved by events and by the towers' own records,
  speed in bench/.
"""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
#: What a fixture may start that runs until stopped.
STARTERS = {"start_tower", "TowerProcess", "HostileTower", "TransportProcess", "Runner", "Reference", "Lab",
            "serve", "SplitModel"}
#: Tests whose upper bound on a clock is the point: (file, test) -> what it bounds (ten times expected or more).
TIMEOUT_BOUNDS = {
    ("test_field_client.py", "test_a_frozen_tower_costs_seconds_and_is_marked_silent"):
        "ten times the silent-after second a frozen tower may cost",
    ("test_field_client.py", "test_a_dead_tower_costs_seconds_and_leaves_the_table"):
        "ten times the silent-after second a dead tower may cost",
    ("test_lab_links.py", "test_stream_over_tailnet"): "ten times a few round trips, below one per token",
    ("test_inference_units.py", "test_a_load_watched_for_progress_without_a_quiet_bound_waits_out_its_timeout"):
        "a 1 s load timeout, 30 s at most",
    ("test_split.py", "test_no_plan_is_a_clear_error_then_a_joining_tower_is_used"): "a refusal, 30 s at most",
    ("test_split_experts.py", "test_frozen_worker_is_stopped_within_the_bound"): "the split's timeout, 10 s at most",
    ("test_split_experts.py", "test_a_load_that_moves_nothing_is_stopped"): "a 2 s quiet bound, 10 s at most",
    ("test_trust.py", "test_a_stranger_named_by_hash_is_refused_without_sending"): "a local refusal, 10 s at most",
    ("test_voice.py", "test_busy_then_cancel_frees_the_engine"): "one decoding window, plus 5 s",
    ("test_lab_shaper.py", "test_tcp_rate_and_delay"): "the lab shaper's own rate and delay, over a same-run baseline",
    # The announce timers themselves, read from the tower's own log (1 ms) with a loaded machine's slack.
    ("test_announce_policy_real.py", "test_heartbeats_come_every_heartbeat_s"): "a heartbeat at most a check late",
    ("test_announce_policy_real.py", "test_pings_never_push_announces_below_the_floor"): "a ping answered by the floor",
    ("test_announce_policy_real.py", "test_a_new_adapter_is_announced_at_once"): "a change announced by the floor",
    ("test_announce_policy_real.py", "test_an_entry_expires_after_two_and_a_half_heartbeats"):
        "an entry gone at 2.5 heartbeats",
}
CLOCKS = {"monotonic", "perf_counter", "time"}
#: Names that hold seconds measured by a clock in these tests.
TIMED = {"seconds", "elapsed", "waited", "took", "gone", "gap", "gaps", "times"}


def modules():
    return sorted(p for p in TESTS.rglob("*.py") if p.name != Path(__file__).name)


def _is_fixture(func):
    for d in func.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Attribute) and target.attr == "fixture":
            return True
    return False


def _calls(node):
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            yield f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _clocked(node):
    for n in ast.walk(node):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in CLOCKS
                and isinstance(n.func.value, ast.Name) and n.func.value.id == "time"):
            return True
        if isinstance(n, ast.Name) and n.id in TIMED:
            return True
    return False


def _starters(tree):
    """STARTERS and the module's own functions that call one, directly or through each other."""
    starters, funcs = set(STARTERS), [f for f in tree.body if isinstance(f, ast.FunctionDef)]
    while True:
        more = {f.name for f in funcs if f.name not in starters and starters & set(_calls(f))}
        if not more:
            return starters
        starters |= more


def test_fixtures_that_start_something_yield_and_stop_it():
    returning = []
    for path in modules():
        tree = ast.parse(path.read_text())
        starters = _starters(tree)
        for func in ast.walk(tree):
            if isinstance(func, ast.FunctionDef) and _is_fixture(func):
                started = starters & set(_calls(func))
                if started and not any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in ast.walk(func)):
                    returning.append(f"{path.relative_to(TESTS)}::{func.name} starts {sorted(started)}")
    assert not returning, "fixtures that return what they started (yield, then stop it):\n" + "\n".join(returning)


def test_no_wall_clock_upper_bound_outside_the_timeout_tests():
    found = []
    for path in modules():
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef) or (path.name, func.name) in TIMEOUT_BOUNDS:
                continue
            for node in ast.walk(func):
                if not isinstance(node, ast.Assert):
                    continue
                for c in ast.walk(node.test):
                    if isinstance(c, ast.Compare) and _bounds_a_clock(c):
                        found.append(f"{path.relative_to(TESTS)}:{node.lineno} {func.name}: {ast.unparse(c)}")
    assert not found, "upper bounds on a clock (prove it by an event or the tower's record):\n" + "\n".join(found)


def _bounds_a_clock(compare):
    """Whether ``compare`` holds ``clocked < x`` (or ``<=``, anywhere in a chain); a bounded
    wait's own loop condition (``time.monotonic() < deadline``) is no claim about speed."""
    sides = [compare.left, *compare.comparators]
    for op, low, high in zip(compare.ops, sides, sides[1:]):
        deadline = isinstance(high, ast.Name) and high.id == "deadline"
        if isinstance(op, (ast.Lt, ast.LtE)) and _clocked(low) and not deadline:
            return True
    return False


def test_every_listed_timeout_test_exists():
    names = {(p.name, f.name) for p in modules() for f in ast.walk(ast.parse(p.read_text()))
             if isinstance(f, ast.FunctionDef)}
    assert set(TIMEOUT_BOUNDS) <= names, set(TIMEOUT_BOUNDS) - names
