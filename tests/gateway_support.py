"""Shared by the gateway tests: a tower process with its own model alias, the
gateway served in-process on a free loopback port, and the tower's live load."""

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx


from announce.caps import decode_full
from reticulum_grid.gateway.server import BackgroundServer
from reticulum_grid.inference.default_model import default_model_path
from reticulum_grid.node.localgrid import free_port, trust_local_towers, wait_port

#: The JavaScript tests (tests/node: the TS client, openai-node, the npm Ollama provider).
NODE_TESTS = Path(__file__).resolve().parent / "node"


def start_tower(hub, name, alias, roles=("infer",), n_ctx=None, settings=None, **sections):
    """A tower serving the default model as ``alias`` (only it has that alias, so
    routing is deterministic even when other test modules' towers are live);
    ``settings``: more of its ``[models.ALIAS]`` keys (e.g. {"embeddings": True})."""
    tower = hub.start_tower(name, {alias: {"path": default_model_path(), **(settings or {})}}, roles=roles,
                            n_ctx=n_ctx, **sections)
    hub.wait_tower(name)
    return tower


#: The tool the gateway tests offer in OpenAI's chat shape, and a tool_choice that forces it.
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}}]
FORCED = {"type": "function", "function": {"name": "get_weather"}}


#: The alias only conftest's ``pool_tower`` serves.
POOL_MODEL = "pool-smol"


def openai_client(url, timeout=120):
    """openai's client on a gateway at ``url``: no retries, so a refusal is seen as it is."""
    import openai
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=timeout)


def serve(hub, **options):
    """The gateway on a free 127.0.0.1 port: a context manager giving its URL."""
    return BackgroundServer(hub.grid, port=free_port(), **options)


def live_load(hub, tower):
    entry = hub.wait_tower(tower.name)
    return decode_full(hub.grid.connection(entry).request("caps/full", {})["caps"]).load


def wait_idle(hub, tower, timeout=10.0):
    """True once the tower runs and queues nothing (False after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        load = live_load(hub, tower)
        if load.streams == 0 and load.queue == 0:
            return True
        time.sleep(0.05)
    return False


def wait_streaming(hub, tower, timeout=30.0):
    """True once the tower runs a stream."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if live_load(hub, tower).streams:
            return True
        time.sleep(0.05)
    return False


TURN = re.compile(r"stream \d+: \d+ token\(s\), admitted ([0-9.]+), turn ([0-9.]+)-([0-9.]+)")


def turns(tower):
    """(admitted, turn start, turn end) of each stream the tower ended normally
    (its own log, wall-clock s), oldest first."""
    return [tuple(map(float, m)) for m in TURN.findall(tower.log())]


STOPPED = re.compile(r"stream \d+: stopped for the client after (\d+) token")


def stops(tower):
    """Tokens each stream had produced when ``tower`` stopped it for its client
    (a cancel or a closed link), from the tower's own log, oldest first."""
    return [int(n) for n in STOPPED.findall(tower.log())]


def wait_stopped(tower, before, timeout=30.0):
    """The token counts of the streams the tower stopped for their client after
    the first ``before`` (see stops()); empty if none within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = stops(tower)[before:]
        if got:
            return got
        time.sleep(0.05)
    return []


def laptop(hub, tmp_path):
    """A client home for another process: the hub's identity (the same person)
    trusting the same towers."""
    home = tmp_path / "laptop"
    home.mkdir()
    shutil.copy(hub.grid.home / "identity", home / "identity")
    trust_local_towers(home, follow=False)
    return home


@contextlib.contextmanager
def serve_process(home, tower, args=(), process=False):
    """`rngrid serve` as a user runs it (its own process, RNS and Grid) on a
    free loopback port, connected to ``tower`` (or an RNS "host:port"), with more
    ``args``; yields the port once it listens, or (port, the Popen) with ``process``."""
    port = free_port()
    address = tower if isinstance(tower, str) else tower.address
    proc = subprocess.Popen([sys.executable, "-m", "reticulum_grid", "--home", str(home), "serve", "--listen",
                             f"127.0.0.1:{port}", "--connect", address, *args], stderr=subprocess.PIPE, text=True)
    try:
        assert wait_port(port, 60), "rngrid serve did not listen"
        yield (port, proc) if process else port
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        proc.stderr.close()


@contextlib.contextmanager
def served_hearing(hub, tower, model, tmp_path):
    """`rngrid serve` in its own process (serve_process, a laptop home under
    ``tmp_path``), yielding its URL once its /v1/models lists ``model``: the
    tower's announce reached that new client (bounded wait, 60 s)."""
    with serve_process(laptop(hub, tmp_path), tower) as port:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while not any(m["id"] == model for m in httpx.get(url + "/v1/models").json()["data"]):
            assert time.monotonic() < deadline, "the served grid never heard the tower"
            time.sleep(0.2)
        yield url


def node_test(name, flags=(), **env):
    """Run tests/node/``name`` under Node.js's test runner (TAP output), its
    environment this process's plus ``env``; the finished CompletedProcess.
    Its output's tail is printed, for the test's report."""
    node = shutil.which("node")
    run = subprocess.run([node, *flags, "--test", "--test-reporter=tap", str(NODE_TESTS / name)],
                         capture_output=True, text=True, timeout=240, env=dict(os.environ, **env))
    print(run.stdout[-3000:], run.stderr[-2000:])
    return run
