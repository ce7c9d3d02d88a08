"""The Grid client: discovers towers over RNS and runs commands on them.

    grid = Grid(connect=["127.0.0.1:4242"])
    for piece in grid.execute("ai/inference", {"model": "smollm2-135m", "prompt": "Hi"}):
        if isinstance(piece, Usage):
            print(piece.tokens_per_s)
        else:
            print(piece, end="", flush=True)

One RNS instance per process (RNS allows no more); one Link per tower, reused
and identified with this machine's identity so towers can check their
allow-lists. Only towers this client trusts (``[trust]`` in ``client.toml``,
node/trust.py) are in its table and get anything from it: prompts, datasets,
adapters, shard plans, sync requests; a trusted tower goes by the name its
trust entry gives it. Others heard are listed apart (``table.strangers()``).
The client keeps its own blob store (``HOME/blobs``) for pulls,
pushes and models it can hand to a tower before running them there, and
what it measured of towers (``HOME/measured.json``, client/measured.py),
which routing trusts over what towers announce.
"""

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import RNS

from announce.announcer import Pinger, TowerListener, remembered_towers
from announce.table import TowerEntry, TowerTable
from links.commands import COMMANDS
from links.wire import Code, WireError
from reticulum_grid.node import config, identity, rnsnet, trust
from reticulum_grid.client import router
from reticulum_grid.client.liveness import Liveness
from reticulum_grid.client import measured
from reticulum_grid.client.measured import MeasuredRates
from reticulum_grid.client import embeddings, split as splitroute, voice
from reticulum_grid.client.busy import BusyWait
from reticulum_grid.store.blobstore import BlobStore
from reticulum_grid.store.collect import collect
from reticulum_grid.store.sync import Progress
from reticulum_grid.node.connection import TowerConnection, wait_until
from reticulum_grid.client.stream import Ask, InferenceStream
from reticulum_grid.client.towerfacts import TowerFacts
from reticulum_grid.client.training import JobCommands
from reticulum_grid.client.transfers import BlobTransfers

log = logging.getLogger("rngrid.client")
T = TypeVar("T")
#: Told before each wait for a free slot: (the busy WireError, seconds it waits).
OnBusy = Callable[[WireError, float], None]

DEFAULT_CONNECT = ("127.0.0.1:4242",)
#: Seconds between discovery pings while nothing suitable has been heard.
PING_INTERVAL_S = 4.0
#: Live load (caps/full) older than this is asked again before routing (seconds).
LIVE_MAX_AGE_S = 1.0
#: A search for a model or tower name that no tower heard has ends once the
#: table has not grown for QUIET_S seconds, and not before ANSWER_S: a tower
#: answers a discovery ping within its floor_s (5 s by default).
QUIET_S = 2.0
ANSWER_S = 6.0
#: Forced discovery pings (after a tower went silent) at most this often (seconds).
PING_FLOOR_S = 1.0
#: On a radio-class interface (rnsnet.on_radio) every ping costs seconds of
#: shared air and makes each tower that hears it announce (~300 bytes), which
#: then delays the very exchanges the client waits on: pings go at most this
#: often, forced or not (seconds).
RADIO_PING_INTERVAL_S = 60.0


class _Quiet:
    """``quiet(entries)`` is true once some towers were heard and none new
    arrived for ``quiet_s`` seconds (and ``at_least_s`` passed since creation)."""

    def __init__(self, quiet_s: float, at_least_s: float = 0.0) -> None:
        self.quiet_s, self.at_least_s = quiet_s, at_least_s
        self.started = self.since = time.monotonic()
        self.count = -1

    def __call__(self, entries: Sequence[TowerEntry]) -> bool:
        now = time.monotonic()
        if len(entries) != self.count:
            self.count, self.since = len(entries), now
        return bool(entries) and now - self.since >= self.quiet_s and now - self.started >= self.at_least_s


class Grid(BlobTransfers, JobCommands, TowerFacts):
    """A grid client.

    ``home``: directory for identity, blobs and RNS state (default RNGRID_HOME or ~/.rngrid).
    ``connect``: towers or transport nodes to reach over TCP ("host:port"); default
    from ``home/client.toml``, else the local tower on 127.0.0.1:4242.
    ``rns_config``: use an existing RNS config dir (e.g. a shared rnsd) instead.
    ``network_name``/``passphrase``: a private grid's IFAC for the RNS config
    written here (default from ``home/client.toml``'s [network]).
    Towers used: those trusted in ``home/client.toml`` (re-read when it changes).
    Raises config.ConfigError for a bad client.toml.
    """

    def __init__(self, home: str | os.PathLike[str] | None = None, connect: Iterable[str] | None = None,
                 rns_config: str | None = None, network_name: str | None = None,
                 passphrase: str | None = None) -> None:
        self.home = Path(home) if home else config.home()
        self.home.mkdir(parents=True, exist_ok=True)
        net = config.load_network(self.home / "client.toml")
        connect = list(connect if connect is not None else (net.connect or DEFAULT_CONNECT))
        self.identity = identity.load_or_create(self.home / "identity")
        self.store = BlobStore(self.home / "blobs")
        collect(self.store)  # leftovers: blobs without an alias, abandoned transfers
        rnsnet.start_client(self.home / "rns", connect, rns_config or net.rns_config,
                            net.network_name if network_name is None else network_name,
                            net.passphrase if passphrase is None else passphrase)
        self.trust = trust.LiveTrust(self.home / "client.toml")
        if self.trust.trust.any:
            log.warning("[trust] any = true in %s: every tower heard gets prompts and data, "
                        "including towers nobody vouched for", self.home / "client.toml")
        self.table = TowerTable(vet=self.trust)
        self.listener = TowerListener(self.table)
        RNS.Transport.register_announce_handler(self.listener)
        self.connections: dict[bytes, TowerConnection] = {}
        self.health = router.HealthBook(MeasuredRates(self.home / measured.FILE))
        self.needs: dict[str, int] = {}
        # model -> {"bytes", "read_bytes", "embedding", ...} as towers' caps/full say (client/split.py)
        self.model_facts: dict[str, dict[str, int]] = {}
        # destination hash -> bytes a token reads of the largest model the tower serves (its bandwidth)
        self.served: dict[bytes, int] = {}
        self.dataplanes: dict[bytes, bool] = {}  # destination hash -> the tower offers a data-plane address
        # destination hash -> {model alias: bytes of the draft its split of that model runs with}
        self.drafts: dict[bytes, dict[str, int]] = {}
        self.liveness = Liveness(self)
        self._pinger = Pinger(self.identity)
        self._last_ping = float("-inf")
        self._ping_sent_at = time.monotonic()  # when the latest ping left (after its interfaces came online)
        self._on_radio = rnsnet.on_radio()
        self._told_offline = False
        self._lock = threading.Lock()
        self.ping()
        self._first_ping_at = self._ping_sent_at
        for destination_hash in remembered_towers():
            RNS.Transport.request_path(destination_hash)

    @property
    def identity_hash(self) -> str:
        return self.identity.hash.hex()

    def close(self) -> None:
        """Tear down this client's Links (RNS itself stops at process exit)."""
        RNS.Transport.deregister_announce_handler(self.listener)
        for conn in list(self.connections.values()):
            conn.close()

    # -- discovery --------------------------------------------------------
    def ping(self, force: bool = False) -> None:
        """Send a discovery ping (towers that hear it announce): at most every
        PING_INTERVAL_S seconds, or PING_FLOOR_S when ``force``d; on a
        radio-class interface at most every RADIO_PING_INTERVAL_S either way."""
        now = time.monotonic()
        interval = RADIO_PING_INTERVAL_S if self._on_radio else PING_FLOOR_S if force else PING_INTERVAL_S
        if now - self._last_ping >= interval:
            self._last_ping = now
            # A ping sent before the TCP interfaces connect is lost.
            online = wait_until(lambda: all(i.online for i in RNS.Transport.interfaces), 3.0)
            if not online and not self._told_offline:
                self._told_offline = True
                log.warning("cannot reach %s yet (is a tower or transport node listening there?); "
                            "RNS keeps retrying every few seconds", ", ".join(rnsnet.offline_peers()) or "a peer")
            self._pinger.ping()
            self._ping_sent_at = time.monotonic()

    def wait_for(self, predicate: Callable[[list[TowerEntry]], T], timeout: float) -> T:
        """Wait (bounded) until ``predicate(live_entries)`` holds, pinging towers
        every PING_INTERVAL_S meanwhile. Returns the predicate's last value."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.table.wait_for(predicate, min(PING_INTERVAL_S, max(0.0, deadline - time.monotonic())))
            if result or time.monotonic() >= deadline:
                return result
            self.ping()

    def towers(self, wait: float = 5.0, quiet_s: float = 1.5) -> list[TowerEntry]:
        """Towers heard within ``wait`` seconds; returns early once some were heard
        and none new arrived for ``quiet_s`` seconds."""
        self.wait_for(_Quiet(quiet_s), wait)
        return self.table.live()

    def find_tower(self, name_or_hash: str, timeout: float = 15.0) -> TowerEntry:
        """A tower by name, full hash or hash prefix, requesting a path when given
        a full hash we have no path to. Raises WireError(no_tower)."""
        key = name_or_hash.strip("<>").lower()
        full_hash = len(key) == 32
        if full_hash and not RNS.Transport.has_path(bytes.fromhex(key)):
            RNS.Transport.request_path(bytes.fromhex(key))
        # A full hash may be a tower far away: only a name or prefix search ends early.
        quiet = (lambda entries: False) if full_hash else _Quiet(QUIET_S, ANSWER_S)
        self.wait_for(lambda entries: self.table.find(name_or_hash) or self._stranger(key) or quiet(entries),
                      timeout)
        entry = self.table.find(name_or_hash)
        stranger = None if entry else self._stranger(key)
        if stranger is not None:
            raise WireError(Code.UNTRUSTED, untrusted_message(stranger))
        if not entry:
            same = self.table.named(name_or_hash)
            if len(same) > 1:
                raise WireError(Code.NO_TOWER, f"{len(same)} towers are called {name_or_hash!r}: "
                                               f"{', '.join(e.hash_hex for e in same)}; name one by its hash")
            heard = ", ".join(e.name for e in self.table.live()) or "none"
            raise WireError(Code.NO_TOWER, f"no tower {name_or_hash!r} heard; heard: {heard}" + self._strangers_note()
                            + _offline_note())
        return entry

    def _stranger(self, key: str) -> TowerEntry | None:
        """An untrusted tower heard with destination hash (or a prefix of >= 8 hex) ``key``."""
        found = [e for e in self.table.strangers()
                 if e.hash_hex == key or len(key) >= 8 and e.hash_hex.startswith(key)]
        return found[0] if len(found) == 1 else None

    def _strangers_note(self) -> str:
        count = len(self.table.strangers())
        return (f"; {count} tower(s) heard that this client does not trust (rngrid towers lists them)"
                if count else "")

    def route(self, model: str, tower: str | None = None, timeout: float = 15.0,
              adapter: str | None = None) -> TowerEntry:
        """The best tower to run ``model`` on (``tower`` overrides). Raises WireError(no_tower)."""
        return self.rank(model, adapter=adapter, tower=tower, timeout=timeout)[0].entry

    def rank(self, model: str, adapter: str | None = None, tower: str | None = None, timeout: float = 15.0,
             settle_s: float = 0.3, complete: bool = False) -> list[router.Choice]:
        """Candidate towers for ``model``, best first (router.py), with their live
        load and RTT refreshed. When no tower has the model but this client does,
        every tower is a candidate (the model is pushed first). ``complete``: wait
        until every tower had time to answer the discovery ping (ANSWER_S, then
        QUIET_S without news) instead of going with the first candidates heard.
        Raises WireError: no_tower when none was heard, unknown_model when the
        towers heard lack the model."""
        local = self.local_blob(model) is not None
        if tower:
            entries = [self.find_tower(tower, timeout)]
            found = router.candidates(entries, model)
        else:
            entries, found = self._discover_for(model, timeout, settle_s, local)
            if complete:
                # Towers answer within ANSWER_S of the ping reaching them, not of this client's start: on a
                # busy machine the interfaces can take seconds to come online before the ping leaves.
                self.wait_for(_Quiet(QUIET_S, ANSWER_S - (time.monotonic() - self._ping_sent_at)), ANSWER_S + QUIET_S)
                entries = self.table.live()
                found = router.candidates(entries, model)
        syncable = bool(tower) or local
        pool = found or (entries if syncable else [])
        self.refresh([e for e in pool if not self.health.get(e.destination_hash).backed_off()])
        # Towers that left the table while being probed (silent again) go only if nothing else is left.
        live = [e for e in map(self.table.get, [e.destination_hash for e in pool]) if e] or pool
        ranked = router.rank(live, model, adapter, self.health, self.needs.get(model, 0), syncable=syncable)
        if not ranked:
            raise WireError(Code.UNKNOWN_MODEL if entries else Code.NO_TOWER, f"no tower has model {model!r}")
        self.health.heard(c.entry for c in ranked)
        return ranked

    def discover(self, ready: Callable[[list[TowerEntry]], object], timeout: float,
                 settle_s: float = 0.3) -> list[TowerEntry]:
        """Live entries once ``ready(live entries)`` holds, or once towers were
        heard and the table went quiet (QUIET_S after ANSWER_S), or after
        ``timeout`` seconds; a pause of ``settle_s`` lets equally good towers
        arrive after the first."""
        if ready(self.table.live()):
            return self.table.live()
        quiet = _Quiet(QUIET_S, ANSWER_S)
        if self.wait_for(lambda entries: ready(entries) or quiet(entries), timeout) and ready(self.table.live()):
            time.sleep(settle_s)
        return self.table.live()

    def _discover_for(self, model: str, timeout: float, settle_s: float,
                      local: bool) -> tuple[list[TowerEntry], list[TowerEntry]]:
        """(live entries, those whose caps list ``model``) once some tower has it
        (any tower when ``local``: this client can push the model) or the table
        went quiet. Raises what _wait_for_model raises."""
        if not router.candidates(self.table.live(), model):
            self._wait_for_model(model, timeout, local)
            time.sleep(settle_s)  # just discovered: let announces from equally good towers arrive
        # A tower known faster than all heard may answer our first ping after a liar: wait (ANSWER_S) for it.
        if (first_answers_by := self._first_ping_at + ANSWER_S - time.monotonic()) > 0:
            trusted = None if (trust := self.trust.trust).any else trust.destinations()  # None: any tower
            self.wait_for(lambda entries: not self.health.faster_unheard(
                router.candidates(entries, model), [e.destination_hash for e in entries],
                lambda h: trusted is None or h in trusted), first_answers_by)
        live = self.table.live()
        return live, router.candidates(live, model)

    def _wait_for_model(self, model: str, timeout: float, local: bool) -> None:
        """Wait until some tower has ``model`` (any when ``local``) or the table went
        quiet. Raises WireError (unknown_model, no_tower) when none heard could run it."""
        ready = (lambda entries: entries) if local else (lambda entries: router.candidates(entries, model))
        quiet = _Quiet(QUIET_S, ANSWER_S)
        self.wait_for(lambda entries: ready(entries) or quiet(entries), timeout)
        if not ready(self.table.live()):
            live = self.table.live()
            heard = ", ".join(f"{e.name} ({', '.join(m.alias for m in e.caps.models) or 'no models'})"
                              for e in live) or "none"
            # Towers were there and none has it: that, not routing, is why it cannot run.
            raise WireError(Code.UNKNOWN_MODEL if live else Code.NO_TOWER,
                            f"no tower with model {model!r} heard; heard: {heard}" + self._strangers_note()
                            + _offline_note())

    def refresh(self, entries: list[TowerEntry], max_age_s: float = LIVE_MAX_AGE_S) -> None:
        """Probe towers whose live load is older than ``max_age_s`` (liveness.Liveness.refresh)."""
        self.liveness.refresh(entries, max_age_s)

    def local_blob(self, name: str) -> bytes | None:
        """The blob id (bytes) ``name`` resolves to in this client's store, or None."""
        try:
            return self.store.resolve(name)
        except WireError:
            return None

    def connection(self, entry: TowerEntry) -> TowerConnection:
        with self._lock:
            conn = self.connections.get(entry.destination_hash)
            if conn is None:
                conn = self.connections[entry.destination_hash] = TowerConnection(
                    self.identity, entry.destination_hash, entry.name)
            return conn

    # -- commands ---------------------------------------------------------
    def execute(self, command: str, payload: Any, tower: str | None = None, timeout: float = 30.0,
                progress: Progress | None = None, busy_wait: float = 0.0,
                on_busy: OnBusy | None = None) -> Any:
        """Run ``command`` on the grid.

        ``ai/inference``: returns an InferenceStream, an iterator of text pieces
        (Text, a str with ``.logprobs``; ToolCallDelta items when the model calls
        a tool) followed by one Usage;
        ``ai/embeddings`` (``{"model", "input"}``): an embeddings.Embeddings;
        ``audio/transcribe`` (``{"audio": file bytes | "file": path, "model"?,
        "language"?, "prompt"?}``): a voice.TranscriptStream (Segments, then a
        TranscriptEnd); ``audio/speech`` (``{"text", "model"?, "voice"?, "wpm"?,
        "format"?}``): a voice.Speech; a model the chosen tower lacks is synced
        to it first (``progress(done_bytes, total_bytes)``); towers that fail are
        replaced (stream.py). While every tower is busy, both wait up to
        ``busy_wait`` seconds for a free slot (0: raise busy at once; client/busy.py),
        telling ``on_busy(error, pause_s)`` before each wait. Other commands
        (links/commands.py) need ``tower`` and return the reply map within
        ``timeout`` seconds. Raises WireError (code + message; bad_request for a
        command not in that table)."""
        if command == "ai/inference":
            return self.infer(payload, tower=tower, progress=progress, busy_wait=busy_wait, on_busy=on_busy)
        if command == "ai/embeddings":
            if not isinstance(payload, dict) or not isinstance(payload.get("model"), str):
                raise WireError(Code.BAD_REQUEST, "ai/embeddings needs a payload map with a 'model' string")
            texts = payload.get("input")
            if not isinstance(texts, str) and not (isinstance(texts, list) and texts
                                                   and all(isinstance(t, str) for t in texts)):
                raise WireError(Code.BAD_REQUEST, "ai/embeddings needs 'input': a string or a list of strings")
            return self.embed(payload["model"], texts, tower=tower, busy_wait=busy_wait, on_busy=on_busy)
        if command in ("audio/transcribe", "audio/speech"):
            return voice.execute(self, command, payload, tower)
        if command not in COMMANDS:
            raise WireError(Code.BAD_REQUEST, f"unknown command {command!r}; known: {', '.join(COMMANDS)}")
        if not tower:
            raise WireError(Code.BAD_REQUEST, f"{command} needs a tower")
        return self.connection(self.find_tower(tower)).request(command, payload, timeout)

    def transcribe(self, data: bytes | bytearray, model: str | None = None, language: str | None = None,
                   prompt: str | None = None, tower: str | None = None,
                   force: bool = False) -> voice.TranscriptStream:
        """A voice.TranscriptStream of an audio file's bytes (any format FFmpeg
        reads): iterate for Segments as they come, or ``.transcript()`` for the
        whole. ``force``: send it over a radio link however long that takes.
        Raises WireError (bad_request for audio that cannot be decoded)."""
        return voice.transcribe(self, data, model, language, prompt, tower, force)

    def speak(self, text: str, model: str | None = None, voice_name: str | None = None, wpm: int | None = None,
              fmt: str = "wav", tower: str | None = None) -> voice.Speech:
        """``text`` spoken by a tower: a voice.Speech (``.data`` in ``fmt``:
        wav, pcm, opus, flac, mp3 or aac; ``.save(path)``). Raises WireError."""
        return voice.speak(self, text, model, voice_name, wpm, fmt, tower)

    def embed(self, model: str, texts: str | Iterable[str], tower: str | None = None,
              busy_wait: float | BusyWait = 0.0, on_busy: OnBusy | None = None) -> embeddings.Embeddings:
        """Embeddings of ``texts`` (a string or a list of strings) from ``model``:
        an embeddings.Embeddings. ``busy_wait``: seconds as in execute, or a
        busy.BusyWait (whose stop() a caller may call from another thread). Raises WireError."""
        wait = busy_wait if isinstance(busy_wait, BusyWait) else BusyWait(self, busy_wait, on_busy)
        return embeddings.embed(self, model, texts, tower=tower, busy_wait=wait)

    def infer(self, payload: dict[str, Any], tower: str | None = None, progress: Progress | None = None,
              busy_wait: float = 0.0,
              on_busy: OnBusy | None = None) -> "InferenceStream | splitroute.SplitStream":
        """The InferenceStream of an ai/inference ``payload`` (see execute)."""
        ask, started = Ask.of(payload), time.perf_counter()
        choices = self.rank(ask.model, adapter=ask.adapter, tower=tower)
        split = None if tower or ask.adapter else splitroute.single_or_split(
            self, ask.model, choices, payload.get("split_policy", "auto"), payload.get("placement", "auto"),
            splitroute.strategies.shape_of(payload))
        if split is not None:
            return splitroute.SplitStream(self, payload, *split, progress=progress, started=started)
        return InferenceStream(self, payload, choices, progress=progress, started=started,
                               busy_wait=BusyWait(self, busy_wait, on_busy), tower=tower)


def stranger_identity(entry: TowerEntry) -> str:
    """The identity hash (hex) of a tower heard, or "" when RNS lost it."""
    identity = RNS.Identity.recall(entry.destination_hash)
    return identity.hash.hex() if identity is not None else ""


def untrusted_message(entry: TowerEntry) -> str:
    """Why nothing goes to the untrusted tower ``entry``, and the line that trusts it."""
    who = stranger_identity(entry) or "IDENTITY"
    return (f"tower {entry.hash_hex} (announcing itself as {entry.name!r}) is not trusted by this client, so "
            f"nothing is sent to it; if it is yours, run: rngrid trust {who} --name NAME")


def _offline_note() -> str:
    offline = rnsnet.offline_peers()
    return f"; cannot reach {', '.join(offline)}" if offline else ""
