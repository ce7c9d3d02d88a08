"""Field cases on the client side: specific refusals keep their code, frozen and
dead towers cost seconds (not 15 s each time) and dead ones leave the table,
a long-lived client survives a transport node restart, every live tower is a
candidate, and the RTT comes from a small round trip. Real tower processes,
frozen with SIGSTOP and killed with SIGKILL."""

import contextlib
import json
import os
import signal
import time

import pytest

from links.wire import Code, WireError
from reticulum_grid.client import Usage
from reticulum_grid.client.grid import LIVE_MAX_AGE_S
from reticulum_grid.client.liveness import SILENT_AFTER_S
from reticulum_grid.client.rows import tower_row
from reticulum_grid.inference.default_model import default_model_path
from reticulum_grid.node.connection import wait_until
from reticulum_grid.node.identity import load_or_create
from reticulum_grid.node.localgrid import TransportProcess, trust_local_towers
from tests.client_process import ClientProcess
from tests.conftest import rngrid

FC = "fc-model"  # the bundled GGUF under an alias only this module's towers A and B have
PROMPT = "Count from 1 to 500, separated by commas: 1, 2, 3,"
BLOBS = 1500  # as many as the tower in the field report held


@pytest.fixture(scope="module")
def pair(hub):
    gguf = default_model_path()
    # B answers discovery pings only 4 s apart (its announce floor), as a tower
    # that announced a moment ago does; A at once.
    towers = {"A": hub.start_tower("fc-A", models={FC: gguf}),
              "B": hub.start_tower("fc-B", models={FC: gguf}, announce={"floor_s": 4, "heartbeat_s": 600})}
    for t in towers.values():
        hub.wait_tower(t.name)
    yield towers
    for t in towers.values():
        _resume(t)
        t.stop()


def _resume(tower):
    if tower.proc and tower.proc.poll() is None:
        os.kill(tower.proc.pid, signal.SIGCONT)


def _hash(hub, tower):
    return hub.wait_tower(tower.name).destination_hash


def _healthy(hub, *towers):
    """Every tower heard, with a fresh live reading and no backoff."""
    for tower in towers:
        if tower.proc.poll() is not None:
            tower.start()
        hub.grid.health.succeeded(_hash(hub, tower))
    entries = [hub.wait_tower(t.name) for t in towers]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # a probe cut short (slower than the others) goes on: wait for all
        hub.grid.refresh(entries, max_age_s=0)
        if all(hub.grid.health.get(e.destination_hash).state == "ok" for e in entries):
            return
        time.sleep(0.5)
    raise AssertionError(f"towers not healthy: {[hub.grid.health.get(e.destination_hash) for e in entries]}")


def run(hub, model=FC, max_tokens=8, tower=None):
    """(text, usage, seconds) of one request (routed unless ``tower`` is named)."""
    started = time.monotonic()
    pieces = list(hub.grid.execute("ai/inference", {"model": model, "prompt": PROMPT, "max_tokens": max_tokens,
                                                    "temperature": 0.0}, tower=tower))
    assert isinstance(pieces[-1], Usage)
    return "".join(pieces[:-1]), pieces[-1], time.monotonic() - started


def test_a_refusal_keeps_its_code(hub):
    # Case 1: a tower that does not allow us said not_allowed; that is the error, not no_tower.
    tower = hub.start_tower("fc-deny", models={"fc-deny-model": default_model_path()}, allow={})
    try:
        hub.wait_tower(tower.name)
        for named in ("fc-deny", None):
            with pytest.raises(WireError) as e:
                run(hub, "fc-deny-model", tower=named)
            assert e.value.code == Code.NOT_ALLOWED, e.value
            assert "rngrid allow" in e.value.message and "fc-deny" in e.value.message
        # Towers were heard and none has the model: unknown_model, not no_tower.
        with pytest.raises(WireError) as e:
            hub.grid.rank("fc-no-such-model", timeout=10)
        assert e.value.code == Code.UNKNOWN_MODEL, e.value
    finally:
        tower.stop()


def _baseline(hub, a, b):
    """Seconds the same request takes with both towers fine and both asked again
    (readings just old): what a frozen or dead one may add to, on this machine now."""
    _healthy(hub, a, b)
    time.sleep(LIVE_MAX_AGE_S + 0.2)  # the live readings are old now: the next request asks both again
    return run(hub)[2]


@contextlib.contextmanager
def back_after(hub, tower):
    """The block may kill ``tower``: it runs again, heard by the hub, when the block ends."""
    try:
        yield
    finally:
        tower.start()
        hub.wait_tower(tower.name)


def test_a_frozen_tower_costs_seconds_and_is_marked_silent(hub, pair):
    # Case 4: A frozen (alive on TCP, never answers) while B is fine.
    a, b = pair["A"], pair["B"]
    healthy_s = _baseline(hub, a, b)
    _healthy(hub, a, b)
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(LIVE_MAX_AGE_S + 0.2)  # the live readings are old now: the next request asks both again
        text, usage, seconds = run(hub)
        assert usage.tower == "fc-B" and text
        # The frozen one gets about a second (SILENT_AFTER_S, after B answered) before it ranks last as
        # silent: the request never waits on it (no failover), and ten of those seconds bound its cost.
        assert usage.failovers == 0, usage
        assert seconds < healthy_s + 10 * SILENT_AFTER_S, f"a frozen tower cost {seconds:.1f} s, {healthy_s:.1f} s " \
                                                           "without (it cost 6-17 s before)"
        health = hub.grid.health.get(_hash(hub, a))
        assert health.state == "silent" and health.backed_off(), (health, seconds)
        assert tower_row(hub.wait_tower(a.name), health)["state"] == "silent"
        assert tower_row(hub.wait_tower(b.name), hub.grid.health.get(_hash(hub, b)))["state"] == "ok"
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)


def test_a_dead_tower_costs_seconds_and_leaves_the_table(hub, pair):
    # Case 13: kill -9 A; routed requests do not wait 15 s each, and A leaves the table.
    a, b = pair["A"], pair["B"]
    healthy_s = _baseline(hub, a, b)
    _healthy(hub, a, b)
    a_hash = _hash(hub, a)
    with back_after(hub, a):
        a.kill()
        times = []
        deadline = time.monotonic() + 40
        while hub.grid.table.get(a_hash) is not None and time.monotonic() < deadline:
            wait = hub.grid.health.get(a_hash).backoff_until - time.monotonic()
            time.sleep(max(0.0, wait) + 1.1)
            _, usage, seconds = run(hub)
            assert usage.tower == "fc-B" and usage.failovers == 0, usage  # never waited on the dead one
            times.append(seconds)
            hub.grid.table.wait_for(lambda _: hub.grid.table.get(a_hash) is None, 4.0)
        assert hub.grid.table.get(a_hash) is None, "a dead tower leaves the table"
        assert max(times) < healthy_s + 10 * SILENT_AFTER_S, f"requests took {times} s with a dead tower, " \
                                                            f"{healthy_s:.1f} s without (15 s each before)"
        assert a_hash not in {e.destination_hash for e in hub.grid.table.live()}


def test_a_stream_that_loses_its_tower_looks_again(hub, pair, reference):
    # Case 12: B is alive but not (yet) in the table; A dies mid-stream.
    a, b = pair["A"], pair["B"]
    _healthy(hub, a, b)
    expected = reference.completion(PROMPT, 60)
    hub.grid.table.remove(_hash(hub, b))
    stream = hub.grid.execute("ai/inference", {"model": FC, "prompt": PROMPT, "max_tokens": 60, "temperature": 0.0})
    assert [c.entry.name for c in stream.choices] == ["fc-A"]
    pieces = []
    with back_after(hub, a):
        for piece in stream:
            pieces.append(piece)
            if len(pieces) == 10:
                a.kill()
        assert "".join(pieces[:-1]) == expected
        assert pieces[-1].tower == "fc-B" and pieces[-1].failovers == 1


def test_route_lists_every_live_tower(hub, pair, tmp_path):
    # Case 12: a fresh client lists both towers, also when B answers the discovery ping late.
    a, b = pair["A"], pair["B"]
    _healthy(hub, a, b)
    hub.grid.ping(force=True)  # B announces now, so it answers the CLI's ping only after its 4 s floor
    result = rngrid("route", "-m", FC, "--json", "--connect", a.address, "--connect", b.address, home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(r["tower"] for r in json.loads(result.stdout)) == ["fc-A", "fc-B"]


def test_rtt_is_a_small_round_trip(hub, pair, tmp_path):
    # Case 14: a tower holding many blobs has a big caps/full; its RTT is still small.
    blobs = []
    for i in range(BLOBS):
        path = tmp_path / f"f{i}.txt"
        path.write_text(f"blob {i}\n")
        blobs.append((path, f"fc-file-{i}", "file", True))
    many = hub.start_tower("fc-many", models={}, blobs=blobs)
    try:
        entry = hub.wait_tower(many.name)
        conn = hub.grid.connection(entry)
        conn.ensure_link()
        full_s = []
        for _ in range(3):
            started = time.monotonic()
            assert len(conn.request("caps/full", {})["blobs"]) >= BLOBS
            full_s.append(time.monotonic() - started)
        for _ in range(3):
            hub.grid.refresh([entry], max_age_s=0)
        rtt = hub.grid.health.get(entry.destination_hash).rtt_s
        print(f"RTT {rtt * 1000:.1f} ms; caps/full {min(full_s) * 1000:.0f}-{max(full_s) * 1000:.0f} ms")
        assert 0 < rtt < min(full_s) / 3, f"RTT {rtt * 1000:.0f} ms vs caps/full {min(full_s) * 1000:.0f} ms"
    finally:
        many.stop()


def _clients_of(transport):
    """TCP connections the transport node accepted on its port, established now."""
    import psutil
    try:
        return sum(c.status == psutil.CONN_ESTABLISHED and c.laddr.port == transport.port
                   for c in psutil.Process(transport.proc.pid).net_connections(kind="tcp"))
    except psutil.Error:
        return 0


def test_a_long_lived_client_survives_a_transport_restart(hub, tmp_path):
    # Case 5: tower T behind transport node X; a client process connected to X only.
    home = tmp_path / "client"
    client_id = load_or_create(home / "identity").hash.hex()
    transport = TransportProcess(hub.root, "fc-transport").start()
    tower = hub.start_tower("fc-T", models={"fc-t-model": default_model_path()}, connect=[transport.address],
                            allow={client_id: ["infer"]})
    trust_local_towers(home, follow=False)
    client = ClientProcess(home, [transport.address])
    try:
        def request(timeout):
            client.ask({"model": "fc-t-model", "prompt": "Hi", "max_tokens": 4, "temperature": 0.0})
            return client.result(timeout)

        first = request(60)
        assert first.usage and not first.error, first
        transport.kill()
        time.sleep(2)  # down for a while, as a restart is
        transport.start()
        # Both TCP clients (the tower and the client process) reconnect: RNS retries every 5 s.
        assert wait_until(lambda: _clients_of(transport) >= 2, 60), "the tower and the client never reconnected"
        again = request(60)
        print(f"after the transport restart the next request took {again.seconds} s")
        assert again.usage and not again.error and again.usage["tower"] == "fc-T", again
    finally:
        client.close()
        tower.stop()
        transport.stop()
