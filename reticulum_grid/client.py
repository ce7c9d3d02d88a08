"""The Grid client: discovers towers over RNS and runs commands on them.

    grid = Grid(connect=["127.0.0.1:4242"])
    for piece in grid.execute("ai/inference", {"model": "smollm2-135m", "prompt": "Hi"}):
        if isinstance(piece, Usage):
            print(piece.tokens_per_s)
        else:
            print(piece, end="", flush=True)

One RNS instance per process (RNS allows no more); one Link per tower, reused
and identified with this machine's identity so towers can check their
allow-lists. The client keeps its own blob store (``HOME/blobs``) for pulls,
pushes and models it can hand to a tower before running them there.
"""

import logging
import secrets
import threading
import time
from pathlib import Path

import RNS

from announce.announcer import Pinger, TowerListener, remembered_towers
from announce.caps import CapsError, decode_full
from announce.table import TowerTable
from links.channel import get_alive
from links.chunks import TransferEnd, TransferProgress
from links.stream import MAX_STREAM_ID
from links.wire import Code, WireError
from reticulum_grid import config, identity, rnsnet, router
from reticulum_grid.blobstore import KINDS, BlobStore, is_blob_id_prefix
from reticulum_grid.connection import TowerConnection, wait_until
from reticulum_grid.inference import InferenceStream, Usage  # noqa: F401 (Usage is part of the client API)
from reticulum_grid.sync import LinkSource, fetch_blob, first_manifest, matching_blob_id

log = logging.getLogger("rngrid.client")

DEFAULT_CONNECT = ("127.0.0.1:4242",)
#: Seconds between discovery pings while nothing suitable has been heard.
PING_INTERVAL_S = 4.0
#: A transfer with no progress message for this long has stalled (seconds).
TRANSFER_IDLE_S = 60.0
#: Live load (caps/full) older than this is asked again before routing (seconds).
LIVE_MAX_AGE_S = 1.0
#: A search for a model or tower name that no tower heard has ends once the
#: table has not grown for QUIET_S seconds, and not before ANSWER_S: a tower
#: answers a discovery ping within its floor_s (5 s by default).
QUIET_S = 2.0
ANSWER_S = 6.0


class _Quiet:
    """``quiet(entries)`` is true once some towers were heard and none new
    arrived for ``quiet_s`` seconds (and ``at_least_s`` passed since creation)."""

    def __init__(self, quiet_s, at_least_s=0.0):
        self.quiet_s, self.at_least_s = quiet_s, at_least_s
        self.started = self.since = time.monotonic()
        self.count = -1

    def __call__(self, entries):
        now = time.monotonic()
        if len(entries) != self.count:
            self.count, self.since = len(entries), now
        return bool(entries) and now - self.since >= self.quiet_s and now - self.started >= self.at_least_s


def _start_rns(home, connect, rns_config):
    if RNS.Reticulum.get_instance() is not None:
        return
    configdir = rns_config or rnsnet.write_config(home / "rns", connect=connect)
    rnsnet.start(configdir)


class Grid:
    """A grid client.

    ``home``: directory for identity, blobs and RNS state (default RNGRID_HOME or ~/.rngrid).
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
        self.store = BlobStore(self.home / "blobs")
        _start_rns(self.home, connect, rns_config or net.rns_config)
        self.table = TowerTable()
        self.listener = TowerListener(self.table)
        RNS.Transport.register_announce_handler(self.listener)
        self.connections = {}
        self.health = router.HealthBook()
        self.needs = {}
        self._live_at = {}
        self._pinger = Pinger(self.identity)
        self._last_ping = 0.0
        self._told_offline = False
        self._lock = threading.Lock()
        self._ping()
        for destination_hash in remembered_towers():
            RNS.Transport.request_path(destination_hash)

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
            # A ping sent before the TCP interfaces connect is lost.
            online = wait_until(lambda: all(i.online for i in RNS.Transport.interfaces), 3.0)
            if not online and not self._told_offline:
                self._told_offline = True
                log.warning("cannot reach %s yet (is a tower or transport node listening there?); "
                            "RNS keeps retrying every few seconds", ", ".join(rnsnet.offline_peers()) or "a peer")
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
        self.wait_for(_Quiet(quiet_s), wait)
        return self.table.live()

    def find_tower(self, name_or_hash, timeout=15.0):
        """A tower by name, full hash or hash prefix, requesting a path when given
        a full hash we have no path to. Raises WireError(no_tower)."""
        key = name_or_hash.strip("<>").lower()
        full_hash = len(key) == 32
        if full_hash and not RNS.Transport.has_path(bytes.fromhex(key)):
            RNS.Transport.request_path(bytes.fromhex(key))
        # A full hash may be a tower far away: only a name or prefix search ends early.
        quiet = (lambda entries: False) if full_hash else _Quiet(QUIET_S, ANSWER_S)
        self.wait_for(lambda entries: self.table.find(name_or_hash) or quiet(entries), timeout)
        entry = self.table.find(name_or_hash)
        if not entry:
            same = self.table.named(name_or_hash)
            if len(same) > 1:
                raise WireError(Code.NO_TOWER, f"{len(same)} towers are called {name_or_hash!r}: "
                                               f"{', '.join(e.hash_hex for e in same)}; name one by its hash")
            heard = ", ".join(e.name for e in self.table.live()) or "none"
            raise WireError(Code.NO_TOWER, f"no tower {name_or_hash!r} heard; heard: {heard}" + _offline_note())
        return entry

    def route(self, model, tower=None, timeout=15.0, adapter=None):
        """The best tower to run ``model`` on (``tower`` overrides). Raises WireError(no_tower)."""
        return self.rank(model, adapter=adapter, tower=tower, timeout=timeout)[0].entry

    def rank(self, model, adapter=None, tower=None, timeout=15.0, settle_s=0.3):
        """Candidate towers for ``model``, best first (router.py), with their live
        load and RTT refreshed. When no tower has the model but this client does,
        every tower is a candidate (the model is pushed first). Raises WireError(no_tower)."""
        if tower:
            entries = [self.find_tower(tower, timeout)]
        else:
            entries = self._discover_for(model, timeout, settle_s)
        syncable = bool(tower) or self.local_blob(model) is not None
        pool = router.candidates(entries, model) or (entries if syncable else [])
        self.refresh([e for e in pool if not self.health.get(e.destination_hash).backed_off()])
        live = [self.table.get(e.destination_hash) or e for e in pool]
        ranked = router.rank(live, model, adapter, self.health, self.needs.get(model, 0), syncable=syncable)
        if not ranked:
            raise WireError(Code.NO_TOWER, f"no tower has model {model!r}")
        return ranked

    def _discover_for(self, model, timeout, settle_s):
        if router.candidates(self.table.live(), model):
            return self.table.live()
        local = self.local_blob(model)
        ready = (lambda entries: entries) if local else (lambda entries: router.candidates(entries, model))
        quiet = _Quiet(QUIET_S, ANSWER_S)
        self.wait_for(lambda entries: ready(entries) or quiet(entries), timeout)
        if not ready(self.table.live()):
            heard = ", ".join(f"{e.name} ({', '.join(m.alias for m in e.caps.models) or 'no models'})"
                              for e in self.table.live()) or "none"
            raise WireError(Code.NO_TOWER, f"no tower with model {model!r} heard; heard: {heard}" + _offline_note())
        time.sleep(settle_s)  # just discovered: let announces from equally good towers arrive
        return self.table.live()

    def refresh(self, entries, max_age_s=LIVE_MAX_AGE_S):
        """Ask towers whose live load is older than ``max_age_s`` for caps/full (all
        at once, on the Links we keep), recording their load, RTT and model needs.
        Towers that do not answer are backed off."""
        now = time.monotonic()
        stale = [e for e in entries if now - self._live_at.get(e.destination_hash, 0.0) > max_age_s]
        if not stale:
            return
        answered = set()
        for entry, full, rtt in self.caps_full(stale, timeout=5.0, timed=True):
            answered.add(entry.destination_hash)
            self._live_at[entry.destination_hash] = time.monotonic()
            self.health.rtt(entry.destination_hash, rtt)
            try:
                self.table.refresh_caps(entry.destination_hash, decode_full(full["caps"]))
            except (CapsError, KeyError) as e:
                log.warning("bad caps/full from %s: %s", entry.name, e)
            for blob in full.get("blobs", ()):
                if isinstance(blob.get("need_mib"), int) and blob.get("alias"):
                    self.needs[blob["alias"]] = blob["need_mib"]
        for entry in stale:
            if entry.destination_hash not in answered:
                self.health.failed(entry.destination_hash)

    def local_blob(self, name):
        """The blob id (bytes) ``name`` resolves to in this client's store, or None."""
        try:
            return self.store.resolve(name)
        except WireError:
            return None

    def connection(self, entry):
        with self._lock:
            conn = self.connections.get(entry.destination_hash)
            if conn is None:
                conn = self.connections[entry.destination_hash] = TowerConnection(
                    self.identity, entry.destination_hash, entry.name)
            return conn

    # -- commands ---------------------------------------------------------
    def execute(self, command, payload, tower=None, timeout=30.0, progress=None):
        """Run ``command`` on the grid.

        ``ai/inference``: returns an InferenceStream, an iterator of text pieces
        (str) followed by one Usage; a model the chosen tower lacks is synced
        to it first (``progress(done_bytes, total_bytes)``); towers that fail are
        replaced (inference.py). Other commands need ``tower`` and return the
        reply map within ``timeout`` seconds. Raises WireError (code + message)."""
        if command == "ai/inference":
            return self.infer(payload, tower=tower, progress=progress)
        if not tower:
            raise WireError(Code.BAD_REQUEST, f"{command} needs a tower")
        return self.connection(self.find_tower(tower)).request(command, payload, timeout)

    def infer(self, payload, tower=None, progress=None):
        if not isinstance(payload, dict) or not isinstance(payload.get("model"), str):
            raise WireError(Code.BAD_REQUEST, "ai/inference needs a payload map with a 'model' string")
        started = time.perf_counter()
        adapter = payload.get("adapter") if isinstance(payload.get("adapter"), str) else None
        choices = self.rank(payload["model"], adapter=adapter, tower=tower)
        return InferenceStream(self, payload, choices, progress=progress, started=started)

    # -- blobs ------------------------------------------------------------
    def holders(self, name, timeout=10.0):
        """Live towers that hold blob ``name`` (alias or blob id hex), from their
        caps, else from their caps/full."""
        live = self.towers(wait=timeout) if not self.table.live() else self.table.live()
        found = [e for e in live if e.caps.model(name) is not None or e.caps.adapter(name)]
        if found:
            return found
        return [e for e, full in self.caps_full(live) if any(
            b.get("alias") == name or b.get("blob_id", b"").hex().startswith(name.lower()) for b in full["blobs"])]

    def caps_full(self, entries, timeout=10.0, timed=False):
        """[(entry, caps/full reply)] of the towers that answer within ``timeout``
        seconds, asked all at once; ``timed`` adds each round trip (seconds)."""
        results = []

        def ask(entry):
            try:
                started = time.monotonic()
                reply = self.connection(entry).request("caps/full", {}, timeout)
                results.append((entry, reply, time.monotonic() - started) if timed else (entry, reply))
            except WireError as e:
                log.info("no caps/full from %s: %s", entry.name, e)

        threads = [threading.Thread(target=ask, args=(e,), daemon=True) for e in entries]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout + 16)
        return list(results)

    def pull(self, name, from_tower=None, alias=None, progress=None):
        """Fetch blob ``name`` into this client's store from every tower that has
        it (or from ``from_tower``), in parallel. Returns (BlobInfo, SyncReport)."""
        entries = [self.find_tower(from_tower)] if from_tower else self.holders(name)
        if not entries:
            raise WireError(Code.UNKNOWN_BLOB, f"no tower heard holds {name!r}")
        connections = [self.connection(e) for e in entries]
        reply = first_manifest(connections, name)
        blob_id = matching_blob_id(name, reply)
        alias = alias or (None if is_blob_id_prefix(name) else name) or (reply.get("aliases") or [None])[0]
        kind = reply.get("kind") if reply.get("kind") in KINDS else "file"
        return fetch_blob(self.store, blob_id, reply.get("manifest"), [LinkSource(c) for c in connections],
                          alias=alias, kind=kind, progress=progress)

    def push(self, name, to_tower, alias=None, progress=None):
        """Send blob ``name`` from this client's store to a tower (needs the
        ``sync`` role there). Returns the tower's report map."""
        entry = to_tower if not isinstance(to_tower, str) else self.find_tower(to_tower)
        blob_id = self.store.resolve(name)
        info = self.store.info(blob_id)
        if info is None:
            raise WireError(Code.UNKNOWN_BLOB, f"blob {name!r} is not complete in this client's store")
        conn = self.connection(entry)
        conn.ensure_link()
        conn.offer(blob_id, self.store.read_chunk)
        xfer_id = secrets.randbelow(MAX_STREAM_ID)
        events = conn.watch_transfer(xfer_id)
        conn.request("blobs/push", {"blob_id": blob_id, "manifest": self.store.manifest_bytes(blob_id),
                                    "alias": alias or (info.aliases[0] if info.aliases else None),
                                    "kind": info.kind, "xfer_id": xfer_id})
        return _await_transfer(conn, events, progress)

    def tower_pull(self, entry, name, sources, alias=None, kind="model", progress=None):
        """Have tower ``entry`` fetch blob ``name`` from the ``sources`` towers
        directly. Returns the tower's report map."""
        conn = self.connection(entry)
        xfer_id = secrets.randbelow(MAX_STREAM_ID)
        events = conn.watch_transfer(xfer_id)
        conn.request("blobs/pull", {"name": name, "sources": [s.destination_hash for s in sources],
                                    "alias": alias, "kind": kind, "xfer_id": xfer_id})
        return _await_transfer(conn, events, progress)

    def sync_to(self, entry, name, kind="model", progress=None):
        """Put blob ``name`` (a model or adapter) on tower ``entry``: from the towers
        that hold it (tower to tower), else, or when that fails, from this client's
        store. Returns the tower's refreshed table entry."""
        has = (lambda caps: caps.model(name)) if kind == "model" else (lambda caps: caps.adapter(name))
        sources = [e for e in self.table.live() if has(e.caps) and e.destination_hash != entry.destination_hash]
        local = self.local_blob(name) is not None
        pulled = False
        if sources:
            try:
                self.tower_pull(entry, name, sources, alias=name, kind=kind, progress=progress)
                pulled = True
            except WireError as e:
                if not local:
                    raise
                log.info("tower-to-tower sync of %s failed (%s); sending it from this client", name, e)
        elif not local:
            code = Code.UNKNOWN_MODEL if kind == "model" else Code.UNKNOWN_ADAPTER
            raise WireError(code, f"neither a tower heard nor this client holds {kind} {name!r}")
        if not pulled:
            self.push(name, entry, alias=name, progress=progress)
        caps = decode_full(self.connection(entry).request("caps/full", {})["caps"])
        return self.table.refresh_caps(entry.destination_hash, caps) or entry

    # -- training ---------------------------------------------------------
    def train_tower(self, tower=None, base=None):
        """``tower`` by name, or (``auto``/None) the live tower granting us ``train``
        with the most free memory, towers already training last."""
        if tower and tower != "auto":
            return self.find_tower(tower)
        entries = [e for e, full in self.caps_full(self.towers(wait=5.0)) if "train" in full.get("you", {}).get("roles", ())]
        if not entries:
            raise WireError(Code.NO_TOWER, "no tower heard grants this identity the train role; a tower's admin "
                                           f"can run: rngrid allow {self.identity_hash} --role train")
        return min(entries, key=lambda e: (e.caps.load.jobs > 0, base is not None and e.caps.model(base) is None,
                                           -e.caps.hardware.memory_free_mib))

    def train(self, request, data_path=None, tower=None, progress=None):
        """Submit a ``genome/train`` job (see train_request.py). ``data_path``: a
        local JSONL file, sent to the tower first. Returns (tower entry, job id)."""
        entry = self.train_tower(tower, request.get("base"))
        if entry.caps.model(request["base"]) is None:
            entry = self.sync_to(entry, request["base"], "model", progress)
        if data_path is not None:
            info = self.store.add_file(data_path, kind="dataset")
            self.push(info.hex, entry, progress=progress)
            request = {**request, "dataset": info.hex}
        return entry, self.connection(entry).request("genome/train", request)["job_id"]

    def job_tower(self, job_id, tower=None):
        """The tower that runs ``job_id`` (asking every live tower when none is named)."""
        entries = [self.find_tower(tower)] if tower else self.towers(wait=5.0)
        for entry in entries:
            try:
                self.connection(entry).request("jobs/status", {"job_id": job_id})
                return entry
            except WireError as e:
                if not tower and e.code in (Code.UNKNOWN_JOB, Code.NOT_ALLOWED, Code.UNREACHABLE, Code.TIMEOUT):
                    continue
                raise
        raise WireError(Code.UNKNOWN_JOB, f"no tower heard runs job {job_id!r}")

    def jobs(self, tower=None):
        """[(tower name, job map)] of this client's jobs on every tower (or one)."""
        out = []
        for entry in ([self.find_tower(tower)] if tower else self.towers(wait=5.0)):
            try:
                out += [(entry.name, job) for job in self.connection(entry).request("jobs/status", {})["jobs"]]
            except WireError as e:
                if tower or e.code not in (Code.NOT_ALLOWED, Code.UNREACHABLE, Code.TIMEOUT):
                    raise
        return out

    def watch(self, job_id, tower=None):
        """Iterator of a job's events until it ends; re-attaches from anywhere."""
        return self.connection(self.job_tower(job_id, tower)).watch_job(job_id)

    def cancel_job(self, job_id, tower=None):
        return self.connection(self.job_tower(job_id, tower)).request("jobs/cancel", {"job_id": job_id})["job"]


def _offline_note():
    offline = rnsnet.offline_peers()
    return f"; cannot reach {', '.join(offline)}" if offline else ""


def _await_transfer(conn, events, progress):
    """Follow a tower-side transfer to its TransferEnd. Raises WireError."""
    while True:
        message = get_alive(events, conn.router, TRANSFER_IDLE_S, "transfer progress")
        if message is None:
            raise WireError(Code.UNREACHABLE, "link to the tower closed during the transfer")
        if isinstance(message, TransferProgress):
            if progress:
                progress(message.done, message.total)
        elif isinstance(message, TransferEnd):
            if not message.ok:
                raise WireError(message.code, message.message)
            return message.report
