"""One model over several towers (reticulum_grid.split), on loopback with real
tower processes, llama.cpp's RPC backend and the real model.

Towers A, B and C each lend 200 MiB and the model needs ~316 MiB, so no tower
runs it alone and a plan takes two: A (which holds the GGUF) coordinates.
The client is its own process connected to these towers only, so towers of
other tests never enter the plan.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from links.wire import Code, WireError
from reticulum_grid.node.localgrid import trust_local_towers
from tests.split.split_support import ALIAS, client_of, identity_fixture, identity_home, lender
from testbed.requirements import needs

pytestmark = needs("llama-rpc", "split inference rides on llama.cpp's RPC backend")

# yield_idle_s: split-a's plan, idle between tests, gives a worker's RPC server to another coordinator.
LEND = {"lend_mib": 200, "threads": 1, "yield_idle_s": 2}
HERE = Path(__file__).resolve().parent


holder_home = identity_fixture("split-holder", "The home of another coordinator, tests/split/rpc_holder.py, that "
                                               "the towers grant ``shard``.")


@pytest.fixture(scope="module")
def split_grid(hub, model_path, tmp_path_factory, holder_home):
    home, client_id = identity_home(tmp_path_factory, "split-client")
    names = ["split-a", "split-b", "split-c", "split-d", "split-x"]

    def tower(name, connect, holds_model=False, trusted=True):
        return lender(hub, name, names, {client_id: ["infer"], holder_home.identity: ["shard"]}, connect, shard=LEND,
                      holds=[(model_path, ALIAS)] if holds_model else (), trusted=trusted)

    a = tower("split-a", [], holds_model=True).start()
    b = tower("split-b", [a.address]).start()
    c = tower("split-c", [a.address, b.address]).start()
    d = tower("split-d", [a.address])  # joins later; the client dials it from the start
    # A stranger lending as much as the others, that every tower grants shard: a plan that took it would fit.
    x = tower("split-x", [a.address], trusted=False).start()
    trust_local_towers(holder_home.path)
    towers = {"split-a": a, "split-b": b, "split-c": c, "split-d": d, "split-x": x}
    # The client trusts these towers (and d once it starts).
    with client_of(hub, home, towers, heard=("split-a", "split-b", "split-c")) as client:
        yield towers, client, home


def test_route_shows_the_split_plan(split_grid, hub, machine):
    towers, client, home = split_grid
    from tests.conftest import rngrid
    hub.wait_tower("split-c")
    connect = [a for n in ("split-a", "split-b", "split-c") for a in ("--connect", towers[n].address)]
    done = rngrid("route", "-m", ALIAS, "--json", *connect, home=home.parent / "route-home", timeout=120)
    assert done.returncode == 0, done.stderr
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(last, dict) and "split" in last, (done.stdout, done.stderr)
    plan = last["split"]
    parts = plan["parts"]
    assert len(parts) == 2 and parts[-1]["tower"] == "split-a" and parts[-1]["role"] == "coordinator", plan
    assert parts[0]["first"] == 0 and parts[0]["end"] == parts[1]["first"] and parts[1]["end"] == plan["n_layers"]
    assert all(p["mib"] <= 200 for p in parts) and plan["reasons"]
    # What the plan is estimated to cost, and how each worker's RPC travels (no data plane here).
    assert plan["estimate"]["tokens_per_s"] > 0 and plan["estimate"]["where"] == "split-a + " + parts[0]["tower"]
    assert plan["estimate"]["link_bytes_per_token"] > 0  # the hidden state crosses the worker's link each token
    assert plan["rpc"] == {parts[0]["tower"]: "RNS tunnel"}
    if machine.backend == "cpu":
        assert plan["single"] is None  # CPU towers offer a whole model only what they lend


def test_split_answer_is_identical_to_one_process(split_grid, reference):
    _, client, _ = split_grid
    client.send(max_tokens=48)
    text, usage, error, plan = client.result()
    assert error is None, error
    assert len(plan) == 2 and plan[-1] == "split-a"
    assert text == reference(48)
    assert usage["completion_tokens"] == 48 and usage["tower"].startswith("split-a + ")


def test_a_forced_tool_call_comes_back_from_a_split_model(split_grid):
    _, client, _ = split_grid
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                               "parameters": {"type": "object", "required": ["city"],
                                                              "properties": {"city": {"type": "string"}}}}}]
    client.send(max_tokens=60, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=tools,
                tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls, usage, error = [], None, None
    while not (item := client.next()).get("done"):
        calls += [item["tool_call"]] if "tool_call" in item else []
        usage, error = item.get("usage", usage), item.get("error", error)
    assert error is None, error
    assert usage["tower"].startswith("split-a + "), usage  # it ran split
    assert {c["name"] for c in calls if c["name"]} == {"get_weather"}
    assert isinstance(json.loads("".join(c["arguments"] for c in calls))["city"], str)
    assert usage["finish_reason"] == "tool_calls"


def test_a_stranger_without_shard_reaches_no_rpc(split_grid, hub):
    towers, _, _ = split_grid
    worker = hub.wait_tower("split-b")
    with pytest.raises(WireError) as refused:
        hub.grid.connection(worker).request("shard/tunnel", {})
    assert refused.value.code == Code.NOT_ALLOWED and "shard" in refused.value.message
    # Every socket the towers' children (RPC server, split model, under their guards) listen on is on 127.0.0.1.
    listening = [addr for t in towers.values() if t.proc for pid in _descendants(t.proc.pid) for addr in _listening(pid)]
    assert listening, "no RPC server or tunnel is listening: the split test above did not run"
    assert all(host == "127.0.0.1" for host, _ in listening), listening


def test_killed_worker_fails_over_with_identical_text(split_grid, reference):
    towers, client, _ = split_grid
    client.send(max_tokens=160)
    plan = client.next()["plan"]
    worker = towers[plan[0]]
    first = client.next()["text"]  # mid-stream
    worker.kill()
    # The rest comes within the client's bound (180 s a piece), a new split loaded through the tunnel first.
    text, usage, error, new_plan = client.result()
    text = first + text
    assert error is None, error
    assert usage["failovers"] >= 1 and plan[0] not in new_plan and "split-a" in new_plan
    assert text == reference(160)


def test_no_plan_is_a_clear_error_then_a_joining_tower_is_used(split_grid, hub, reference):
    """Only the coordinator is left of the trusted towers: no plan, though the stranger that
    lends beside it would make one fit; then a trusted tower joins and the plan takes it."""
    towers, client, _ = split_grid
    for name in [n for n in ("split-b", "split-c") if towers[n].proc.poll() is None]:
        towers[name].kill()
    assert hub.grid.wait_for(lambda _: any(e.name == "split-x" for e in hub.grid.table.strangers()), 60)
    started = time.monotonic()
    client.send(max_tokens=8)
    _, _, error, _ = client.result()
    assert error is not None and error["code"] == Code.NO_TOWER and "does not fit" in error["message"], error
    assert "split-x" not in error["message"] and towers["split-x"].proc.poll() is None
    assert time.monotonic() - started < 30
    towers["split-d"].start()
    hub.wait_tower("split-d")
    client.send(max_tokens=8, wait_towers=4)
    text, usage, error, plan = client.result()
    assert error is None, error
    assert plan == ["split-d", "split-a"] and text == reference(8)


def test_a_worker_another_coordinator_uses_is_busy_until_that_coordinator_dies(split_grid, holder_home, reference):
    """With split-d the only trusted lender left (b and c were killed above):
    another coordinator (tests/split/rpc_holder.py) takes split-d's RPC
    server from split-a's idle plan and keeps using it. The request is told
    busy, naming split-d, instead of hanging; once that coordinator dies with
    its Link up, split-d serves split-a's plan again."""
    towers, client, _ = split_grid
    holder = subprocess.Popen([sys.executable, str(HERE / "rpc_holder.py"), "--active", str(holder_home.path),
                               towers["split-d"].address, "split-d"], stdout=subprocess.PIPE, text=True,
                              cwd=HERE.parents[1])
    try:
        assert json.loads(holder.stdout.readline()) == {"held": True}
        client.send(max_tokens=8, wait_towers=4)
        _, _, error, _ = client.result()
        assert error is not None and error["code"] == Code.BUSY and "split-d" in error["message"], error
    finally:
        holder.kill()
        holder.wait(10)
    for _ in range(6):  # bounded: split-d's keepalive finds the dead holder within seconds
        client.send(max_tokens=8, wait_towers=4)
        text, usage, error, plan = client.result()
        if error is None or error["code"] != Code.BUSY:
            break
        time.sleep(5)
    assert error is None, error
    assert plan == ["split-d", "split-a"] and text == reference(8)


def test_split_never_runs_the_model_whole_on_its_holder(split_grid):
    _, client, _ = split_grid
    client.send(max_tokens=8, wait_towers=2, split_policy="never")
    text, usage, error, plan = client.result()
    assert error is None, error
    assert plan is None and usage["tower"] == "split-a" and usage["completion_tokens"] == 8 and text


def test_an_unknown_split_policy_is_refused_by_name(split_grid):
    _, client, _ = split_grid
    client.send(max_tokens=8, wait_towers=2, split_policy="sometimes")
    _, _, error, _ = client.result()
    assert error["code"] == Code.BAD_REQUEST and "auto, always, never" in error["message"]


def _descendants(pid):
    """Process ids of ``pid``'s children, theirs, and so on."""
    import psutil
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _listening(pid):
    """(host, port) of the TCP sockets ``pid`` listens on (IPv4 and IPv6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, v6 in (("tcp", False), ("tcp6", True)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                host_hex, port_hex = fields[1].split(":")
                found.append((_host(host_hex, v6), int(port_hex, 16)))
    return found


def _host(hex_addr, v6):
    import ipaddress
    raw = bytes.fromhex(hex_addr)
    if not v6:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return str(ipaddress.IPv6Address(words))
