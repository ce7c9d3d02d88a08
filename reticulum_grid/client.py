"""The Grid client: discovers towers over RNS and runs commands on them.

    grid = Grid(connect=["127.0.0.1:4242"])
    for piece in grid.execute("ai/inference", {"model": "smollm2-135m", "prompt": "Hi"}):
        if isinstance(piece, Usage):
            print(piece.tokens_per_s)
        else:
            print(piece, end="", flush=True)

One RNS instance per process (RNS allows no more); one Link per tower, reused
and identified with this machine's identity so towers can check their
allow-lists.
"""

import logging
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import RNS

from announce.announcer import APP_NAME, TOWER_ASPECT, Pinger, TowerListener
from announce.table import TowerTable
from links import wire
from links.channel import ChannelRouter
from links.stream import MAX_STREAM_ID, StreamCancel, StreamReceiver, StreamRoutes
from links.wire import Code, WireError
from reticulum_grid import config, identity, rnsnet, router

log = logging.getLogger("rngrid.client")

DEFAULT_CONNECT = ("127.0.0.1:4242",)
#: Seconds between discovery pings while nothing suitable has been heard.
PING_INTERVAL_S = 4.0


@dataclass
class Usage:
    """Ends an inference stream. Tokens are counts; times in seconds; rate in tokens/s.

    ``ttft_s`` is measured by the client, from execute() to the first text;
    ``tower_ttft_s`` is the tower's prompt processing time to the first token."""
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    tokens_per_s: float
    tower: str
    finish_reason: str
    tower_ttft_s: float = 0.0
    queued_s: float = 0.0


def _start_rns(home, connect, rns_config):
    if RNS.Reticulum.get_instance() is not None:
        return
    configdir = rns_config or rnsnet.write_config(home / "rns", connect=connect)
    rnsnet.start(configdir)


class Grid:
    """A grid client.

    ``home``: directory for identity and RNS state (default RNGRID_HOME or ~/.rngrid).
    ``connect``: towers or transport nodes to reach over TCP ("host:port"); default
    from ``home/client.toml``, else the local tower on 127.0.0.1:4242.
    ``rns_config``: use an existing RNS config dir (e.g. a shared rnsd) instead.
    """

    def __init__(self, home=None, connect=None, rns_config=None):
        self.home = Path(home) if home else config.home()
        self.home.mkdir(parents=True, exist_ok=True)
        net = config.load_network(self.home / "client.toml")
        connect = list(connect if connect is not None else (net.connect or DEFAULT_CONNECT))
        self.identity = identity.load_or_create(self.home / "identity")
        _start_rns(self.home, connect, rns_config or net.rns_config)
        self.table = TowerTable()
        self.listener = TowerListener(self.table)
        RNS.Transport.register_announce_handler(self.listener)
        self.connections = {}
        self._pinger = Pinger(self.identity)
        self._last_ping = 0.0
        self._lock = threading.Lock()
        self._ping()

    @property
    def identity_hash(self):
        return self.identity.hash.hex()

    def close(self):
        """Tear down this client's Links (RNS itself stops at process exit)."""
        RNS.Transport.deregister_announce_handler(self.listener)
        for conn in list(self.connections.values()):
            conn.close()

    # -- discovery --------------------------------------------------------
    def _ping(self, force=False):
        now = time.monotonic()
        if force or now - self._last_ping >= PING_INTERVAL_S:
            self._last_ping = now
            _wait_interfaces_online(timeout=3.0)
            self._pinger.ping()

    def wait_for(self, predicate, timeout):
        """Wait (bounded) until ``predicate(live_entries)`` holds, pinging towers
        every PING_INTERVAL_S meanwhile. Returns the predicate's last value."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.table.wait_for(predicate, min(PING_INTERVAL_S, max(0.0, deadline - time.monotonic())))
            if result or time.monotonic() >= deadline:
                return result
            self._ping()

    def towers(self, wait=5.0, quiet_s=1.5):
        """Towers heard within ``wait`` seconds; returns early once some were heard
        and none new arrived for ``quiet_s`` seconds."""
        state = {"n": -1, "since": time.monotonic()}

        def settled(entries):
            if len(entries) != state["n"]:
                state["n"], state["since"] = len(entries), time.monotonic()
            return bool(entries) and time.monotonic() - state["since"] >= quiet_s

        self.wait_for(settled, wait)
        return self.table.live()

    def find_tower(self, name_or_hash, timeout=15.0):
        """A tower by name, full hash or hash prefix, requesting a path when given
        a full hash we have no path to. Raises WireError(no_tower)."""
        key = name_or_hash.strip("<>").lower()
        if len(key) == 32 and not RNS.Transport.has_path(bytes.fromhex(key)):
            RNS.Transport.request_path(bytes.fromhex(key))
        entry = self.wait_for(lambda _: self.table.find(name_or_hash), timeout)
        if not entry:
            raise WireError(Code.NO_TOWER, f"no tower {name_or_hash!r} heard within {timeout:.0f} s")
        return entry

    def route(self, model, tower=None, timeout=15.0, settle_s=0.3):
        """The tower to run ``model`` on (``tower`` overrides). Raises WireError."""
        if tower:
            return self.find_tower(tower, timeout)
        if router.candidates(self.table.live(), model):
            return router.choose(self.table.live(), model)
        if not self.wait_for(lambda entries: router.candidates(entries, model), timeout):
            heard = ", ".join(f"{e.name} ({', '.join(m.alias for m in e.caps.models) or 'no models'})"
                              for e in self.table.live()) or "none"
            raise WireError(Code.NO_TOWER, f"no tower with model {model!r} heard within {timeout:.0f} s; heard: {heard}")
        time.sleep(settle_s)  # just discovered: let announces from equally good towers arrive
        return router.choose(self.table.live(), model)

    # -- commands ---------------------------------------------------------
    def connection(self, entry):
        with self._lock:
            conn = self.connections.get(entry.destination_hash)
            if conn is None:
                conn = self.connections[entry.destination_hash] = TowerConnection(self, entry)
            return conn

    def execute(self, command, payload, tower=None, timeout=30.0):
        """Run ``command`` on the grid.

        ``ai/inference``: returns an InferenceStream, an iterator of text pieces
        (str) followed by one Usage. Other commands need ``tower`` and return the
        reply map. Raises WireError (code + message) on refusal or failure."""
        if command == "ai/inference":
            return self.infer(payload, tower=tower, timeout=timeout)
        if not tower:
            raise WireError(Code.BAD_REQUEST, f"{command} needs a tower")
        return self.connection(self.find_tower(tower)).request(command, payload, timeout)

    def infer(self, payload, tower=None, timeout=30.0):
        if not isinstance(payload, dict) or not isinstance(payload.get("model"), str):
            raise WireError(Code.BAD_REQUEST, "ai/inference needs a payload map with a 'model' string")
        started = time.perf_counter()
        entry = self.route(payload["model"], tower=tower)
        conn = self.connection(entry)
        stream_id = secrets.randbelow(MAX_STREAM_ID)
        receiver = conn.open_stream(stream_id)
        try:
            conn.request("ai/inference", {**payload, "stream_id": stream_id}, timeout)
        except BaseException:
            conn.close_stream(stream_id)
            raise
        return InferenceStream(conn, receiver, started, entry.name, idle_timeout=timeout)


class TowerConnection:
    """One reusable, identified Link to one tower."""

    def __init__(self, grid, entry):
        self.grid = grid
        self.entry = entry
        self.link = None
        self.router = None
        self.streams = None
        self.receivers = {}
        self._lock = threading.Lock()

    def ensure_link(self, timeout=15.0):
        with self._lock:
            if self.link is not None and self.link.status == RNS.Link.ACTIVE:
                return self.link
            h = self.entry.destination_hash
            if not RNS.Transport.has_path(h):
                RNS.Transport.request_path(h)
                if not _wait(lambda: RNS.Transport.has_path(h), timeout):
                    raise WireError(Code.UNREACHABLE, f"no path to tower {self.entry.name} within {timeout:.0f} s")
            destination = RNS.Destination(RNS.Identity.recall(h), RNS.Destination.OUT, RNS.Destination.SINGLE,
                                          APP_NAME, TOWER_ASPECT)
            established = threading.Event()
            link = RNS.Link(destination, established_callback=lambda _: established.set(),
                            closed_callback=self._closed)
            if not established.wait(timeout):
                link.teardown()
                raise WireError(Code.UNREACHABLE, f"no link to tower {self.entry.name} within {timeout:.0f} s")
            link.identify(self.grid.identity)
            self.link, self.router = link, ChannelRouter(link)
            self.streams = StreamRoutes(self.router)
            return link

    def request(self, path, payload, timeout=30.0):
        """Send one command and wait for its reply map. Raises WireError."""
        link = self.ensure_link()
        done, box = threading.Event(), {}

        def on_response(receipt):
            box["data"] = receipt.response
            done.set()

        receipt = link.request(path, wire.pack(payload), response_callback=on_response,
                               failed_callback=lambda _: done.set(), timeout=timeout)
        if not receipt:
            raise WireError(Code.UNREACHABLE, f"could not send {path} to {self.entry.name}")
        done.wait(timeout + 1.0)
        if "data" not in box:
            raise WireError(Code.TIMEOUT, f"{self.entry.name} did not answer {path} within {timeout:.0f} s")
        return wire.parse_response(box["data"])

    def open_stream(self, stream_id):
        self.ensure_link()
        receiver = self.receivers[stream_id] = StreamReceiver(stream_id)
        self.streams.add(stream_id, receiver.deliver)
        return receiver

    def close_stream(self, stream_id):
        self.receivers.pop(stream_id, None)
        if self.streams is not None:
            self.streams.remove(stream_id)

    def cancel(self, stream_id):
        if self.router is not None and self.link.status == RNS.Link.ACTIVE:
            self.router.send(StreamCancel(stream_id))
        self.close_stream(stream_id)

    def close(self):
        if self.link is not None:
            self.link.teardown()

    def _closed(self, link):
        for receiver in list(self.receivers.values()):
            receiver.abort(Code.UNREACHABLE, f"link to tower {self.entry.name} closed")


class InferenceStream:
    """Iterator of text pieces (str) followed by one Usage.

    Leaving the iteration early (break, exception, Ctrl-C) cancels the stream
    on the tower. ``text`` holds what arrived; ``usage`` is set at the end."""

    def __init__(self, conn, receiver, started, tower, idle_timeout=30.0):
        self.conn = conn
        self.receiver = receiver
        self.started = started
        self.tower = tower
        self.idle_timeout = idle_timeout
        self.text = ""
        self.usage = None
        self._finished = False

    def __iter__(self):
        first_at = None
        try:
            for event in self.receiver.events(self.idle_timeout):
                if event[0] == "text":
                    if first_at is None:
                        first_at = time.perf_counter()
                    self.text += event[1]
                    yield event[1]
                else:
                    self._finished = True
                    self.usage = self._usage(event[1], event[2], first_at)
                    yield self.usage
        except WireError:
            self._finished = True  # the tower ended the stream itself
            raise
        finally:
            if self._finished:
                self.conn.close_stream(self.receiver.stream_id)
            else:
                self.cancel()

    def cancel(self):
        """Stop generation on the tower (idempotent)."""
        self._finished = True
        self.conn.cancel(self.receiver.stream_id)

    def _usage(self, finish_reason, usage, first_at):
        def num(key, kind=float):
            value = usage.get(key, 0)
            return kind(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else kind(0)
        return Usage(prompt_tokens=num("prompt_tokens", int), completion_tokens=num("completion_tokens", int),
                     ttft_s=(first_at or time.perf_counter()) - self.started, tokens_per_s=num("tokens_per_s"),
                     tower=self.tower, finish_reason=finish_reason, tower_ttft_s=num("ttft_s"),
                     queued_s=num("queued_s"))


def _wait(predicate, timeout, poll_s=0.05):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def _wait_interfaces_online(timeout):
    # A ping sent before the TCP interfaces connect is lost.
    _wait(lambda: all(i.online for i in RNS.Transport.interfaces), timeout)
